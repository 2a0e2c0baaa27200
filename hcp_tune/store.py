"""Measurements and recommendations under ``results/``: the one module that imports pandas.

Layout of a results folder:

- ``rows/<sweep-key-hash>/<trial-id>.json``: one file per finished trial, written
  atomically the moment its result is known. This is the source of truth: a killed
  orchestrator loses nothing that finished, and two sweeps writing the same folder never
  touch the same file.
- ``trials.csv`` and ``recommendations.csv``: derived tables, rebuilt from the rows under
  an exclusive lock (``.lock``) and replaced atomically, so a reader sees the old table or
  the new one, and concurrent sweeps serialise their rebuilds instead of interleaving.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from hcp_tune.errors import HcpError
from hcp_tune.noise import row_noise
from hcp_tune.spec import TrialResult, TrialSpec, atomic_write_text

KEY_FIELDS = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "env_tag")
# The columns of trials.csv (what ``trial_row`` returns, in order; a row's extra fields,
# such as a skipped layout's ``predicted_step_s``, follow) and of recommendations.csv.
# Both files always have their header, even when nothing was stored or ranked.
TRIAL_COLUMNS = (
    *KEY_FIELDS, "trial_id", "a2a", "p2p", "comm_type", "status", "failure_class", "error",
    "median_s", "p10_s", "p90_s", "steps", "step_times_s", "peak_mem_bytes",
    "tflops_per_gpu", "wall_s", "mem_note", "backend", "te_backend", "qkv_format", "notes",
    "verified", "fingerprint", "job_id",
    "log_path", "phases_s", "schema_version",
)
# The version of a stored row's fields. Rows written before it existed have none and read
# as version 1 (their fields are a subset); a row from a newer hcp-tune is refused.
ROW_SCHEMA = 1
RECOMMENDATION_COLUMNS = (
    *KEY_FIELDS, "a2a", "p2p", "comm_type", "median_s", "peak_mem_bytes", "runner_up",
    "runner_up_median_s", "margin", "tie", "speedup_vs_p2p", "speedup_vs_a2a", "trials",
    "ok_trials", "incomplete", "missing",
)


class ResultsTooNew(HcpError):
    """The results folder holds rows of a newer schema than this version reads."""


@dataclass(frozen=True)
class SweepKey:
    """What a recommendation is for: one measured configuration of one software stack."""

    cluster: str
    model: str
    tp: int
    cp: int
    seq: int
    runner: str
    env_tag: str
    pp: int = 1

    @property
    def name(self) -> str:
        # pp=1 is left out so that keys (and their slugs, row folders and optuna studies)
        # stored before pp joined the key stay the same
        return "|".join(f"{k}={getattr(self, k)}" for k in KEY_FIELDS
                        if k != "pp" or self.pp != 1)

    @property
    def slug(self) -> str:
        return hashlib.sha1(self.name.encode()).hexdigest()[:12]


def trial_row(key: SweepKey, spec: TrialSpec, result: TrialResult, **extra: Any) -> dict[str, Any]:
    """One flat row: the key, the layout, the status and every measured statistic."""
    return {
        **{k: getattr(key, k) for k in KEY_FIELDS},
        "trial_id": spec.trial_id,
        "a2a": spec.a2a,
        "p2p": spec.p2p,
        "comm_type": spec.comm_type,
        "status": result.status.value,
        "failure_class": result.failure_class.value if result.failure_class else "",
        "error": result.error or "",
        "median_s": result.median_s,
        "p10_s": result.p10_s,
        "p90_s": result.p90_s,
        "steps": len(result.step_times_s),
        "step_times_s": json.dumps(result.step_times_s),
        "peak_mem_bytes": result.peak_mem_bytes,
        "tflops_per_gpu": result.tflops_per_gpu,
        "wall_s": result.wall_s,
        "mem_note": result.mem_note,
        "backend": result.backend,
        "te_backend": result.te_backend,  # the kernel TE selected ("" on the torch reference)
        "qkv_format": result.qkv_format,
        "notes": "; ".join(result.notes),
        "verified": verified(result.verification),
        "fingerprint": json.dumps(result.fingerprint, sort_keys=True),
        "job_id": result.job_id or "",
        "log_path": result.log_path or "",
        # rank 0's seconds per phase (start, groups, proof, warmup, measure): where a
        # trial's time outside its measured steps went
        "phases_s": json.dumps(result.phases_s, sort_keys=True),
        "schema_version": ROW_SCHEMA,
        **extra,
    }


def verified(evidence: dict[str, Any]) -> bool:
    """The trial proved CP active: its groups matched the plan and its output and
    gradients matched single-process attention (hcp-facts.md section 4); for a Bridge
    trial, every TE attention module held the planned groups at train start
    (job/bridge_verify.py: ``cp_active``)."""
    if "cp_active" in evidence:
        cp = evidence["cp_active"] or {}
        return bool(cp.get("checked")) and not cp.get("problems")
    return bool(evidence.get("groups", {}).get("match")) and bool(
        evidence.get("numerics", {}).get("passed"))


class ResultStore:
    """Rows in, tables out; every write atomic."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def row_path(self, key: SweepKey, trial_id: str) -> Path:
        return self.root / "rows" / key.slug / f"{trial_id}.json"

    def add(self, row: dict[str, Any], key: SweepKey) -> None:
        """Persist one finished trial now (atomic, one file per trial)."""
        atomic_write_text(str(self.row_path(key, row["trial_id"])), json.dumps(row, default=str))

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row (dicts with the trials.csv columns). Raises ``ResultsTooNew``
        for a row written by a newer hcp-tune, whose fields this one cannot vouch for."""
        out = []
        for path in sorted((self.root / "rows").glob("*/*.json")):
            try:
                row = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # a foreign or damaged file must not hide the rest
            version = row.get("schema_version", 1) if isinstance(row, dict) else 1
            if isinstance(version, int) and version > ROW_SCHEMA:
                raise ResultsTooNew(
                    f"{path}: row schema {version} > {ROW_SCHEMA}, the newest this hcp-tune "
                    "reads: it was written by a newer hcp-tune; upgrade hcp-tune, or use "
                    "another results_dir")
            if isinstance(row, dict):
                row.setdefault("pp", 1)  # rows stored before pp joined the key
            out.append(row)
        return out

    def rebuild(self) -> tuple[Path, Path]:
        """Rewrite trials.csv and recommendations.csv from the rows, under the lock."""
        import pandas as pd

        with self._lock():
            rows = self.rows()
            extra = [k for r in rows for k in r if k not in TRIAL_COLUMNS]
            trials = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *dict.fromkeys(extra)])
            recs = pd.DataFrame(recommendations(trials.to_dict("records")),
                                columns=list(RECOMMENDATION_COLUMNS))
            t_path, r_path = self.root / "trials.csv", self.root / "recommendations.csv"
            atomic_write_text(str(t_path), trials.to_csv(index=False))
            atomic_write_text(str(r_path), recs.to_csv(index=False))
        return t_path, r_path

    def recommendations(self) -> list[dict[str, Any]]:
        path = self.root / "recommendations.csv"
        if not path.exists():
            return []
        import pandas as pd

        try:
            frame = pd.read_csv(path, dtype={k: str for k in ("cluster", "model", "runner",
                                                               "env_tag")})
        except pd.errors.EmptyDataError:  # written by an older version with nothing ranked
            return []
        recs = json.loads(frame.to_json(orient="records"))
        for r in recs:  # a table written before pp joined the key
            if r.get("pp") is None:
                r["pp"] = 1
        return recs


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layout of one key, the best ok trial, fastest first (memory breaks ties)."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for r in rows:
        if r["status"] != "ok" or not r.get("verified") or _nan(r.get("median_s")):
            continue  # only trials that proved CP was active are ranked
        k = (r["a2a"], r["p2p"])
        if k not in best or r["median_s"] < best[k]["median_s"]:
            best[k] = r
    return sorted(best.values(), key=lambda r: (r["median_s"], r.get("peak_mem_bytes") or 0))


def recommendations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One recommendation per sweep key that has at least one ranked (ok) trial."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(tuple(r[k] for k in KEY_FIELDS), []).append(r)
    out = []
    for key, key_rows in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        ranked = rank(key_rows)
        if not ranked:
            continue
        best = ranked[0]
        second: Optional[dict[str, Any]] = ranked[1] if len(ranked) > 1 else None
        margin = (second["median_s"] / best["median_s"] - 1) if second else None
        noise = max(row_noise(best), row_noise(second)) if second else 0.0
        base = {r["comm_type"]: r for r in ranked}
        cp = best["cp"]
        out.append({
            **dict(zip(KEY_FIELDS, key)),
            "a2a": best["a2a"],
            "p2p": best["p2p"],
            "comm_type": best["comm_type"],
            "median_s": best["median_s"],
            "peak_mem_bytes": best.get("peak_mem_bytes"),
            "runner_up": f"[{second['a2a']},{second['p2p']}]" if second else "",
            "runner_up_median_s": second["median_s"] if second else None,
            "margin": margin,
            "tie": bool(second) and margin <= noise,
            "speedup_vs_p2p": (base["p2p"]["median_s"] / best["median_s"]) if "p2p" in base and cp > 1 else None,
            "speedup_vs_a2a": (base["a2a"]["median_s"] / best["median_s"]) if "a2a" in base and cp > 1 else None,
            "trials": len(key_rows),
            "ok_trials": sum(r["status"] == "ok" for r in key_rows),
            "incomplete": bool(missing_layouts(key_rows)),
            "missing": "; ".join(missing_layouts(key_rows)),
        })
    return out


def _why_not(r: dict[str, Any]) -> str:
    cls = r.get("failure_class")
    return f"{r['status']} {cls}" if isinstance(cls, str) and cls else str(r["status"])


def missing_layouts(key_rows: list[dict[str, Any]]) -> list[str]:
    """Layouts of a key tried without a valid measurement ("[2,2] cancelled"): the key's
    ranking is incomplete until they are measured. A layout pruned after some measured
    steps counts as measured (it lost); one pruned before any, or cancelled, skipped,
    failed or invalid does not."""
    measured = {(r["a2a"], r["p2p"]) for r in key_rows
                if (r["status"] == "ok" and r.get("verified"))
                or (r["status"] == "pruned" and not _nan(r.get("median_s")))}
    why: dict[tuple[int, int], str] = {}
    for r in key_rows:
        k = (r["a2a"], r["p2p"])
        if k not in measured:
            why[k] = _why_not(r)  # the latest row's reason (rows are in trial-id order)
    return [f"[{a},{p}] {w}" for (a, p), w in sorted(why.items())]
