"""Synthetic results folders for ``store_scale.py``: a nightly regression store of N trials,
written either through the sweep's own write path or in bulk.

The shape: ``nights`` env tags (``nightly-0000`` ...), ``keys_per_night`` sweep keys per
night (cluster=local, model=tiny, cp=8, tp 1 and 2, seq 4096, 8192, ...: what a real
config of that shape plans, so a sweep over the same keys resumes them), ``trials_per_key``
trials per key cycling through the key's kept layouts (tp=1: a2a 1,2,4,8; tp=2: 1,2,4).
Every tenth trial fails (oom), every tenth is pruned, the rest are ok and verified; medians,
memory and step times are a deterministic function of (key, trial number).

- ``write_real``: per trial what a sweep does: ``LayoutStudy.ask`` -> ``submitted`` ->
  ``ResultStore.add`` -> ``tell`` (10-30 ms a trial: half an hour for 100,000).
- ``write_bulk``: the same row files, and the same journal operations written to each
  key's journal (``journals/<slug>.journal``) in one write (no optuna call per trial). A test
  (tests/store/test_store_gen.py) shows that at small N the two folders read the same
  rows, trials, recommendations and Pareto fronts, byte for byte after a rebuild, and that
  each key's journal holds the same operations but for times and writer ids.

Not a test and not part of hcp_tune: a benchmark's fixture.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Iterator

from hcp_tune.store.records import row_text
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row
from hcp_tune.store.studies import METRIC_NAMES, ORCHESTRATOR, row_attrs, state_of
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

CP = 8
PROOF = {"groups": {"match": True}, "numerics": {"passed": True}}
FINGERPRINT = {"torch": "2.13.0", "transformer_engine": "2.9.0", "megatron_core": "0.16.0",
               "gpu": "NVIDIA H200", "driver": "570.86.15", "cuda": "12.9", "nccl": "2.26.5",
               "hosts": ["node-001", "node-002"], "python": "3.12.3"}
BULK_WORKER = "bulk-generator"
BULK_TIME = "2026-01-01T00:00:00.000000+00:00"
JOBS_FOLDER = "/results/jobs"  # the submitted trials' job folder (an attribute only)


def kept_a2a(tp: int) -> list[int]:
    """The layouts config.load keeps for model=tiny (8 heads), cp=8: a2a divides 8/tp."""
    return [a for a in (1, 2, 4, 8) if a <= 8 // tp]


def night_tag(night: int) -> str:
    return f"nightly-{night:04d}"


def key_of(night: int, i: int) -> SweepKey:
    """The ``i``-th key of a night: tp alternates 1, 2; seq 4096 * (1 + i // 2)."""
    return SweepKey("local", "tiny", 1 + i % 2, CP, 4096 * (1 + i // 2), "attention",
                    night_tag(night))


def keys(nights: int, keys_per_night: int) -> list[SweepKey]:
    return [key_of(n, i) for n in range(nights) for i in range(keys_per_night)]


def sweep_args(night: int, keys_per_night: int) -> list[str]:
    """config.load overrides whose sweep plans exactly a night's keys (for resume timing)."""
    seqs = sorted({key_of(night, i).seq for i in range(keys_per_night)})
    tps = sorted({key_of(night, i).tp for i in range(keys_per_night)})
    return ["cluster=local", "model=tiny", f"cp={CP}", f"tp=[{','.join(map(str, tps))}]",
            f"seq=[{','.join(map(str, seqs))}]", "runner=attention",
            f"env_tag={night_tag(night)}"]


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    return zlib.crc32(repr(parts).encode()) / 2**32


def synthetic_row(key: SweepKey, number: int, a2a: int) -> dict[str, Any]:
    """Trial ``number`` of ``key`` (layout ``a2a``) as the sweep stores it (``trial_row``)."""
    trial_id = f"{key.slug}-t{number:03d}-a{a2a}"
    spec = TrialSpec(trial_id=trial_id, a2a=a2a, p2p=key.cp // a2a, tp=key.tp, seq=key.seq,
                     heads=8, kv_heads=8, head_dim=8)
    kind = number % 10
    res = TrialResult(trial_id=trial_id, status=Status.OK, verification=PROOF,
                      fingerprint=FINGERPRINT, job_id=f"{1000 + number}",
                      log_path=f"/results/jobs/{1000 + number}_0_log.out")
    if kind == 7:
        res.status, res.failure_class = Status.FAILED, FailureClass.OOM
        res.error = "CUDA out of memory. Tried to allocate 2.00 GiB"
        return trial_row(key, spec, res)
    base = 0.05 * (1 + key.seq / 4096) * (1 + 0.1 * abs(a2a - 2))
    steps = [round(base * (1 + 0.02 * _unit(key.name, number, s)), 6) for s in range(20)]
    if kind == 9:
        res.status, steps = Status.PRUNED, steps[:5]
    res.step_times_s = steps
    ordered = sorted(steps)
    res.median_s = ordered[len(ordered) // 2]
    res.p10_s, res.p90_s = ordered[len(ordered) // 10], ordered[(9 * len(ordered)) // 10]
    res.peak_mem_bytes = int(2**30 * (1 + a2a / 8) * (1 + key.seq / 65536))
    res.tflops_per_gpu = round(100 + 50 * _unit(key.name, number), 3)
    res.wall_s = round(sum(steps) + 3.0, 3)
    res.backend, res.te_backend, res.qkv_format = "te", "FusedAttention", "bshd"
    res.phases_s = {"start": 1.2, "groups": 0.3, "proof": 0.4, "warmup": 0.5,
                    "measure": round(sum(steps), 3)}
    return trial_row(key, spec, res)


def trials(key: SweepKey, n: int) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(number, a2a, row) of the key's first ``n`` trials, cycling through its layouts."""
    kept = kept_a2a(key.tp)
    for number in range(n):
        a2a = kept[number % len(kept)]
        yield number, a2a, synthetic_row(key, number, a2a)


def write_real(root: Path, key_list: list[SweepKey], trials_per_key: int,
               storage: Any = None) -> None:
    """Through the sweep's write path: ask -> submitted -> row file -> tell, per trial."""
    from hcp_tune.store.studies import LayoutStudy

    store = ResultStore(root)
    storage = store.ledger(storage)
    for key in key_list:
        study = LayoutStudy(storage, key.name, kept_a2a(key.tp))
        for number, a2a, row in trials(key, trials_per_key):
            got_number, trial_id, got = study.ask(a2a, key.slug)
            assert (got_number, trial_id, got) == (number, row["trial_id"], a2a)
            study.submitted(number, row["job_id"], "slurm", JOBS_FOLDER)
            store.add(row, key)
            study.tell(number, Status(row["status"]), None, row=row)


def _op(code: int, **fields: Any) -> str:
    return json.dumps({"op_code": code, "worker_id": BULK_WORKER, **fields},
                      separators=(",", ":"))


def _key_ops(key: SweepKey, study_id: int, first_trial: int,
             trials_per_key: int) -> Iterator[str]:
    """The journal lines ``write_real`` makes optuna append for one key (optuna's journal
    operations: create study, set its metric names; per trial: create (enqueued), start,
    set the a2a parameter, the ask's (its orchestrator: this process, also on the enqueued
    trial) and submit's attributes, the row's attributes, end)."""
    from optuna.distributions import CategoricalDistribution, distribution_to_json

    kept = kept_a2a(key.tp)
    dist = distribution_to_json(CategoricalDistribution(kept))
    yield _op(0, study_name=key.name, directions=[1, 1])
    yield _op(3, study_id=study_id, system_attr={"study:metric_names": list(METRIC_NAMES)})
    for number, a2a, row in trials(key, trials_per_key):
        tid = first_trial + number
        yield _op(4, study_id=study_id, datetime_start=None, state=4, value=None, values=None,
                  distributions={}, params={}, user_attrs={"orchestrator": ORCHESTRATOR},
                  system_attrs={"fixed_params": {"a2a": a2a}}, intermediate_values={})
        yield _op(6, trial_id=tid, state=0, values=None, datetime_start=BULK_TIME)
        yield _op(5, trial_id=tid, param_name="a2a", param_value_internal=kept.index(a2a),
                  distribution=dist)
        for k, v in (("trial_id", row["trial_id"]), ("orchestrator", ORCHESTRATOR),
                     ("executor", "slurm"), ("folder", JOBS_FOLDER), ("job_id", row["job_id"]),
                     *row_attrs(row).items()):
            yield _op(8, trial_id=tid, user_attr={k: v})
        state, values = state_of(row)
        yield _op(6, trial_id=tid, state=int(state.value), values=values,
                  datetime_complete=BULK_TIME)


def write_bulk(root: Path, key_list: list[SweepKey], trials_per_key: int) -> None:
    """The same folder as ``write_real`` into an empty folder (the default ledger, one
    journal per key; not for an RDB storage): row files written plainly, each key's
    journal in one write."""
    root.mkdir(parents=True, exist_ok=True)
    journals = root / "journals"
    if journals.exists():
        raise ValueError(f"{journals} exists: write_bulk writes into an empty folder")
    journals.mkdir()
    store = ResultStore(root)
    for key in key_list:
        folder = root / "rows" / key.slug
        folder.mkdir(parents=True, exist_ok=True)
        for _, _, row in trials(key, trials_per_key):
            store.row_path(key, row["trial_id"]).write_text(row_text(row))
        # each key's journal numbers its one study and its trials from 0
        (journals / f"{key.slug}.journal").write_text(
            "\n".join(_key_ops(key, 0, 0, trials_per_key)) + "\n")
