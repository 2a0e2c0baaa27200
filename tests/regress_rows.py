"""Recorded-style trial rows for the regress/report tests: the writer is the store's own
``trial_row`` (hcp_tune/store.py), so these rows have exactly the shape sweeps store."""
from __future__ import annotations

import itertools
from pathlib import Path

from hcp_tune.engine.store import ResultStore, SweepKey, trial_row
from hcp_tune.spec import Status, TrialResult, TrialSpec

FP = {"torch": "2.13.0", "transformer_engine": "2.9.0", "megatron_core": "0.16.1",
      "hosts": ["node1"], "settings": {}, "inject_delay": None}
_ids = itertools.count()


def row(tag: str, a2a: int, p2p: int, median: float, *, mem: int = 1 << 30, seq: int = 4096,
        status: str = "ok", fp: dict | None = None, model: str = "tiny") -> dict:
    key = SweepKey(cluster="local", model=model, tp=1, cp=a2a * p2p, seq=seq,
                   runner="attention", env_tag=tag)
    spec = TrialSpec(trial_id=f"{key.slug}-t{next(_ids):04d}-a{a2a}", a2a=a2a, p2p=p2p,
                     seq=seq, heads=8, kv_heads=8, head_dim=8)
    ok = status == "ok"
    steps = [median * f for f in (0.98, 1.0, 1.02)] if ok else []
    result = TrialResult(
        trial_id=spec.trial_id, status=Status(status), step_times_s=steps,
        median_s=median if ok else None, p10_s=steps[0] if ok else None,
        p90_s=steps[-1] if ok else None, peak_mem_bytes=mem if ok else None,
        verification={"groups": {"match": ok}, "numerics": {"passed": ok}},
        fingerprint=dict(FP if fp is None else fp))
    return trial_row(key, spec, result)


def rows_for(tag: str, a2a: int, p2p: int, medians, **kw) -> list[dict]:
    return [row(tag, a2a, p2p, m, **kw) for m in medians]


def store(results_dir: Path, rows: list[dict]) -> Path:
    s = ResultStore(results_dir)
    for r in rows:
        key = SweepKey(**{k: r[k] for k in ("cluster", "model", "tp", "cp", "seq", "runner",
                                              "env_tag")})
        s.add(r, key)
    return results_dir
