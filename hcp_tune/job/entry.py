"""Run trials by hand on every rank (torchrun, srun without submitit)::

    python -m hcp_tune.job.entry SPEC.json OUT.json [SPEC2.json OUT2.json ...]

Each SPEC.json runs with OUT.json as its ``result_path``, through the same batch runner a
submitit job uses (``job.batch.run_batch``). The per-rank run lives in ``job.trial``, the
backend choice in ``job.backend``, failure classes in ``job.failures``, the merge of rank
results in ``hcp_tune.merge``; their names stay importable from here, where they used to be.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from hcp_tune.job.backend import Backend, choose_backend, fingerprint  # noqa: F401 (old path)
from hcp_tune.job.batch import run_batch, run_trials, write_result  # noqa: F401 (old path)
from hcp_tune.job.failures import FAULTS, EnvironmentProblem, classify  # noqa: F401 (old path)
from hcp_tune.job.trial import ProcessSet, run_trial  # noqa: F401 (old path)
from hcp_tune.merge import merge_root_cause, rank_out_path  # noqa: F401 (old path)
from hcp_tune.spec import Status, spec_from_json


def main(argv: Optional[list[str]] = None) -> int:
    """By hand: each SPEC.json runs with OUT.json as its ``result_path``."""
    import dataclasses

    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) % 2:
        print("usage: python -m hcp_tune.job.entry SPEC.json OUT.json [SPEC.json OUT.json ...]",
              file=sys.stderr)
        return 2
    specs = [dataclasses.replace(spec_from_json(Path(args[i]).read_text()),
                                 result_path=str(Path(args[i + 1]).resolve()))
             for i in range(0, len(args), 2)]
    results = run_batch(specs)
    code = 1 if any(r.status == Status.FAILED for r in results) else 0
    if code:  # the process group may be broken: do not wait in interpreter teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
