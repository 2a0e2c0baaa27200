"""Drive the real sweep loop on a designed truth (``runner=synthetic``), in this process,
for the simulation benchmarks (decision_cost.py, interval_coverage.py, power_rule.py).

What belongs here: how a benchmark runs ``python -m hcp_tune sweep ... runner=synthetic``
as a user would (``hcp_tune.cli.main`` with the same arguments; its printing silenced)
and reads back what the sweep stored: each key's rows and its recommendation. Nothing
here decides anything: the plan, the adaptive rounds, early stopping, the figures, the
verdicts and the tables are the sweep's own.

Also the held-out discipline: ``FROZEN_AT`` is the commit at which the ranking's rule
files were frozen before any held-out figure was produced; ``held_out_status`` says
whether they are still as frozen (a figure is called held-out only then).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hcp_tune import cli  # noqa: E402
from hcp_tune.engine import synthetic  # noqa: E402
from hcp_tune.store.folder import ResultStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frozen import changed_since as rule_changes  # noqa: E402

# The ranking's rule: what decides a verdict, an adaptive round or an early stop.
RULE_FILES = ["hcp_tune/stats/verdict.py", "hcp_tune/stats/shrinkage.py",
              "hcp_tune/engine/sweep_adaptive.py", "hcp_tune/engine/trials.py",
              "conf/search/default.yaml"]
FROZEN_AT = "ace62397c3"  # the ranking's rule frozen here, before any held-out run
SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None  # fsync is free there
CP = 8  # model=tiny has 8 heads: layouts a2a = 1, 2, 4, 8
LAYOUTS = (1, 2, 4, 8)


def held_out_status(frozen: Optional[str] = FROZEN_AT) -> str:
    """'held out (rule frozen at X)' when no rule file's code changed since ``frozen``
    (``frozen.changed_since``: a file moved since, or its imports' module paths, is not a
    change); else why the figures are not held-out."""
    if not frozen:
        return "NOT held-out: no freeze commit recorded (a development run)"
    changed = rule_changes(frozen, RULE_FILES)
    if changed is None:
        return f"NOT held-out: freeze commit {frozen} not found"
    if changed:
        return f"NOT held-out: rule files changed since the freeze at {frozen}: {', '.join(changed)}"
    return f"held out: rule files unchanged since the freeze at {frozen}"


def truth_doc(medians: list[float], noise: list[dict[str, Any]],
              session: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """A truth file's content: layout a2a=LAYOUTS[i] at ``medians[i]`` with ``noise[i]``."""
    return {"layouts": {str(a): {"median_s": m, "noise": n}
                        for a, m, n in zip(LAYOUTS, medians, noise)},
            "session": session or {}}


def sweep(truth: dict[str, Any], *, seed: int, keys: int, overrides: tuple[str, ...] = (),
          folder: Optional[Path] = None, seq0: int = 1024) -> tuple[int, Path]:
    """One ``sweep`` of ``keys`` keys (seq = seq0, 2 seq0, ...), each its own session of
    the truth, into ``folder`` (a new scratch folder by default); (exit code, folder)."""
    folder = folder or Path(tempfile.mkdtemp(prefix="hcp-syn-", dir=SCRATCH))
    path = folder / "truth.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(truth))
    seqs = ",".join(str(seq0 * (i + 1)) for i in range(keys))
    argv = ["sweep", f"cp={CP}", f"seq=[{seqs}]", "tp=1", "pp=1", "model=tiny",
            "cluster=local", "runner=synthetic", f"runner.truth={path}",
            f"runner.seed={seed}", f"results_dir={folder / 'results'}",
            "search.order_by_prediction=false", *overrides]
    rc, out = run_cli(argv)
    if rc not in (0, 1):
        raise RuntimeError(f"sweep exited {rc}: {out.getvalue()[-2000:]}")
    return rc, folder


def run_cli(argv: list[str]) -> tuple[int, io.StringIO]:
    """``python -m hcp_tune ARGV`` in this process, its output silenced: (exit code, output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        return cli.main(argv), out


def stored(folder: Path) -> list[tuple[Any, list[dict[str, Any]], dict[str, Any]]]:
    """Per key the sweep stored: (key, its rows, its recommendation)."""
    store = ResultStore(folder / "results")
    recs = {(r["seq"]): r for r in store.recommendations()}
    out = []
    for key in store.folder_keys().values():
        out.append((key, store.key_rows(key), recs.get(key.seq, {})))
    return sorted(out, key=lambda t: t[0].seq)


def true_medians(truth: dict[str, Any], seed: int, key: Any) -> dict[int, float]:
    """Each layout's true median in the key's session (the truth's median times the
    session's common and per-layout effects; a bimodal layout's mixture median)."""
    t = synthetic.parse_truth(truth)
    shift, per = synthetic.session_effects(t, seed, key.name)
    return {a: lay.median_s * math.exp(shift + per[a] + _mixture_offset(lay.noise))
            for a, lay in t.layouts.items()}


def _mixture_offset(noise: Any) -> float:
    """The median of a trial's log deviation (0 but for the bimodal kind)."""
    if noise.kind != "bimodal" or noise.p <= 0:
        return 0.0
    from scipy import optimize, stats

    s, up = max(noise.cv, 1e-9), math.log1p(noise.shift)
    f = lambda x: (1 - noise.p) * stats.norm.cdf(x / s) + noise.p * stats.norm.cdf(  # noqa: E731
        (x - up) / s) - 0.5
    return float(optimize.brentq(f, -10 * s - 1, up + 10 * s + 1))
