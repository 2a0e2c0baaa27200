"""Measurements and recommendations under ``results/``: the one module that imports pandas.

Layout of a results folder:

- ``optuna.journal`` (or ``search.storage``): the record, one optuna study per sweep key;
  each finished trial holds its whole row (``tuner``).
- ``rows/<sweep-key-hash>/<trial-id>.json``: one file per finished trial, written
  atomically the moment its result is known (before it is told to the study, so a killed
  orchestrator loses nothing) and rewritten from the studies by ``rebuild``: a view,
  read through ``ResultStore.rows()``, or only the folders a command needs (``key_rows``:
  one key's; ``tag_rows``: the keys of some env tags, found from one row per folder), so
  that what ``recommend``, ``report env_tag=X``, ``regress`` and resume planning cost does
  not grow with every night the folder holds. Files the studies lack (an older
  hcp-tune's folder) are imported into them once.
- ``trials.csv`` and ``recommendations.csv``: tables rebuilt from the studies under an
  exclusive lock (``.lock``) and replaced atomically, so a reader sees the old table or
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

from hcp_tune.costmodel.microbatch import tokens_per_gpu_s
from hcp_tune.engine.records import (
    KEY_FIELDS,
    OLDER_ROW_DEFAULTS,
    RECOMMENDATION_COLUMNS,
    ROW_SCHEMA,
    TRIAL_COLUMNS,
    Recommendation,
    ResultsTooNew,
    TrialRow,
    Verification,
    key_field,
    row_text,
)
from hcp_tune.noise import row_noise
from hcp_tune.spec import TrialResult, TrialSpec, atomic_write_text

# The columns of trials.csv (``records.TrialRow``'s fields, in order; a row's extra
# fields, such as a skipped layout's ``predicted_step_s``, follow) and of
# recommendations.csv (``records.Recommendation``'s). Both files always have their header,
# even when nothing was stored or ranked.
__all__ = ["KEY_FIELDS", "TRIAL_COLUMNS", "RECOMMENDATION_COLUMNS", "ROW_SCHEMA",
           "ResultsTooNew", "ResultStore", "SweepKey", "trial_row", "recommendations"]


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
    dp: int = 1
    mbs: int = 1
    micro_batches: int = 1

    @property
    def name(self) -> str:
        # a field at its OLDER_ROW_DEFAULTS value is left out so that keys (and their slugs,
        # row folders and optuna studies) stored before it joined the key stay the same
        return "|".join(f"{k}={getattr(self, k)}" for k in KEY_FIELDS
                        if getattr(self, k) != OLDER_ROW_DEFAULTS.get(k))

    @property
    def slug(self) -> str:
        return hashlib.sha1(self.name.encode()).hexdigest()[:12]

    @classmethod
    def of(cls, row: dict[str, Any]) -> "SweepKey":
        """The key a row (or recommendation) belongs to, from its key fields."""
        return cls(**{k: key_field(row, k) for k in KEY_FIELDS})

    def holds(self, row: dict[str, Any]) -> bool:
        """The row is one of this key's trials (selected by the key's fields, not an id)."""
        return all(key_field(row, k) == getattr(self, k) for k in KEY_FIELDS)


def key_rows(rows: list[dict[str, Any]], key: SweepKey) -> list[dict[str, Any]]:
    """The rows (or recommendations) of one sweep key, selected by its fields: the one
    selection every command uses (an older row's missing key fields read as their defaults)."""
    return [r for r in rows if key.holds(r)]


def single_run_fields(key: SweepKey, spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """The micro-batch fields of a row measured by one run (``spec``): runner=bridge
    measured at ``spec.micro_batches`` (at the user's m, its median is the step there);
    the attention runner has none."""
    if spec.runner != "bridge":
        return {}
    m = max(1, spec.micro_batches)
    return {"measured_micro_batches": json.dumps([m]),
            "point_medians_s": json.dumps([result.median_s]),
            "step_at_user_m_s": result.median_s if m == key.micro_batches else None}


def trial_row(key: SweepKey, spec: TrialSpec, result: TrialResult, *,
              micro: Optional[dict[str, Any]] = None, **extra: Any) -> dict[str, Any]:
    """One flat row (``records.TrialRow.to_dict``): the key, the layout, the status and
    every measured statistic. ``micro``: the micro-batch fields of a trial measured at
    several m (``engine.trials.point_fields``); default those of one run of ``spec``."""
    return TrialRow(
        **{k: getattr(key, k) for k in KEY_FIELDS},
        trial_id=spec.trial_id,
        a2a=spec.a2a,
        p2p=spec.p2p,
        comm_type=spec.comm_type,
        status=result.status.value,
        failure_class=result.failure_class.value if result.failure_class else "",
        error=result.error or "",
        median_s=result.median_s,
        p10_s=result.p10_s,
        p90_s=result.p90_s,
        steps=len(result.step_times_s),
        step_times_s=json.dumps(result.step_times_s),
        peak_mem_bytes=result.peak_mem_bytes,
        tflops_per_gpu=result.tflops_per_gpu,
        wall_s=result.wall_s,
        mem_note=result.mem_note,
        backend=result.backend,
        te_backend=result.te_backend,
        qkv_format=result.qkv_format,
        notes="; ".join(result.notes),
        verified=verified(result.verification),
        fingerprint=json.dumps(result.fingerprint, sort_keys=True),
        job_id=result.job_id or "",
        log_path=result.log_path or "",
        phases_s=json.dumps(result.phases_s, sort_keys=True),
        **(single_run_fields(key, spec, result) if micro is None else micro),
        extra=extra,
    ).to_dict()


def verified(evidence: dict[str, Any]) -> bool:
    """The trial proved CP active (``records.Verification``)."""
    return Verification.from_dict(evidence).verified


class ResultStore:
    """Rows in, tables out; every write atomic. The optuna studies in ``storage`` (default
    ``<root>/optuna.journal``) are the record; the row files and tables are its views."""

    def __init__(self, root: str | Path, storage: Any = None) -> None:
        self.root = Path(root)
        self.storage = storage

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

    def add(self, row: dict[str, Any] | TrialRow, key: SweepKey) -> None:
        """Write one trial's row file now (atomic, one file per trial): the view written
        through, so a killed orchestrator loses nothing it was told."""
        row = row.to_dict() if isinstance(row, TrialRow) else row
        atomic_write_text(str(self.row_path(key, row["trial_id"])), row_text(row))

    def _files(self, slug: Optional[str] = None) -> list[tuple[Path, str, TrialRow]]:
        """Every readable row file (``slug``: only that key's folder, ``rows/<slug>/``):
        (path, text, row). Raises ``ResultsTooNew``."""
        out = []
        pattern = f"{slug}/*.json" if slug is not None else "*/*.json"
        for path in sorted((self.root / "rows").glob(pattern)):
            try:
                text = path.read_text()
                raw = json.loads(text)
                if not isinstance(raw, dict):
                    continue
                out.append((path, text, TrialRow.from_dict(raw, where=str(path))))
            except (OSError, json.JSONDecodeError, TypeError):
                continue  # a foreign or damaged file must not hide the rest
        return out

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row (dicts with the trials.csv columns; an older row's missing
        fields take their defaults). Raises ``ResultsTooNew`` for a row written by a newer
        hcp-tune, whose fields this one cannot vouch for."""
        return [row.to_dict() for _, _, row in self._files()]

    def key_rows(self, key: SweepKey) -> list[dict[str, Any]]:
        """The rows of one sweep key, selected by its fields. Reads only the key's folder
        (``rows/<slug>/``: every writer files a row under its key's slug, and a rebuild
        moves a row the studies hold there), so its cost is the key's rows, not the
        folder's."""
        return key_rows([row.to_dict() for _, _, row in self._files(key.slug)], key)

    def folder_keys(self) -> dict[str, SweepKey]:
        """Each row folder (by slug) and the key its rows belong to, read from one readable
        row of it (every row in ``rows/<slug>/`` is that key's): what a folder holds,
        without reading every row."""
        out: dict[str, SweepKey] = {}
        for folder in sorted((self.root / "rows").glob("*/")):
            for path in sorted(folder.glob("*.json")):
                try:
                    raw = json.loads(path.read_text())
                    out[folder.name] = SweepKey.of(raw)
                    break
                except (OSError, json.JSONDecodeError, TypeError, AttributeError):
                    continue  # a foreign or damaged file: ask the next one
        return out

    def tag_rows(self, env_tags: set[str]) -> list[dict[str, Any]]:
        """The rows of the keys measured under ``env_tags``, in ``rows()``'s order: reads
        those keys' folders only (``report env_tag=X`` and ``regress`` cost the tags they
        name, not every night the folder holds)."""
        out = []
        for slug, key in self.folder_keys().items():
            if str(key.env_tag) in env_tags:
                out += [row.to_dict() for _, _, row in self._files(slug)
                        if str(row.env_tag) in env_tags]
        return out

    def rebuild(self, storage: Any = None) -> tuple[Path, Path]:
        """Under the lock: import row files the studies lack (a folder written by an older
        hcp-tune, or a row written just before its orchestrator died), then rewrite the
        row files, trials.csv and recommendations.csv from the studies."""
        import pandas as pd

        from hcp_tune.engine import tuner

        storage = storage or self.storage or self.root / "optuna.journal"
        with self._lock():
            ledger = tuner.Ledger(storage)
            names = ledger.names()
            held = ledger.rows(names)
            orphans: dict[str, list[dict[str, Any]]] = {}
            on_disk: dict[Path, str] = {}  # each row file is read once
            for path, text, row in self._files():
                on_disk[path] = text
                name = SweepKey.of(row.to_dict()).name
                if (name, row.trial_id) not in held:
                    orphans.setdefault(name, []).append(json.loads(row_text(row.to_dict())))
            for name, key_rows in orphans.items():
                ledger.import_rows(name, key_rows)
            if orphans:
                names = ledger.names()
                held = ledger.rows(names)
            views = []
            for (name, trial_id), text in held.items():
                row = TrialRow.from_dict(json.loads(text), where=f"{storage}: study {name}")
                path = self.row_path(SweepKey.of(row.to_dict()), trial_id)
                if on_disk.get(path) != text:
                    atomic_write_text(str(path), text)
                views.append((path, row.to_dict()))
            rows = [r for _, r in sorted(views, key=lambda v: v[0])]
            # one pass over the studies: asking ``ledger.pareto`` per study made the
            # rebuild quadratic in studies (each call listed every study)
            held_names = {n for n, _ in held}
            known = set(names)
            pareto = {name: ledger.pareto(name, known) for name in held_names}
            extra = [k for r in rows for k in r if k not in TRIAL_COLUMNS]
            trials = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *dict.fromkeys(extra)])
            recs = pd.DataFrame(recommendations(trials.to_dict("records"), pareto),
                                columns=list(RECOMMENDATION_COLUMNS))
            t_path, r_path = self.root / "trials.csv", self.root / "recommendations.csv"
            atomic_write_text(str(t_path), trials.to_csv(index=False))
            atomic_write_text(str(r_path), recs.to_csv(index=False))
        return t_path, r_path

    def recommendations(self) -> list[dict[str, Any]]:
        """recommendations.csv as dicts (``records.Recommendation``: a table of an older
        version reads with defaults, one of a newer version raises ``ResultsTooNew``)."""
        path = self.root / "recommendations.csv"
        if not path.exists():
            return []
        import pandas as pd

        try:
            frame = pd.read_csv(path, dtype={k: str for k in ("cluster", "model", "runner",
                                                               "env_tag", "pareto")})
        except pd.errors.EmptyDataError:  # written by an older version with nothing ranked
            return []
        recs = json.loads(frame.to_json(orient="records"))
        return [Recommendation.from_dict(r, where=str(path)).to_dict() for r in recs]


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


def recommendations(rows: list[dict[str, Any]],
                    pareto: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
    """One recommendation per sweep key that has at least one ranked (ok) trial;
    ``pareto``: per key name, its study's Pareto front (``tuner.Ledger.pareto``)."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(tuple(key_field(r, k) for k in KEY_FIELDS), []).append(r)
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
        out.append(Recommendation(
            **dict(zip(KEY_FIELDS, key)),
            a2a=best["a2a"],
            p2p=best["p2p"],
            comm_type=best["comm_type"],
            median_s=best["median_s"],
            peak_mem_bytes=best.get("peak_mem_bytes"),
            runner_up=f"[{second['a2a']},{second['p2p']}]" if second else "",
            runner_up_median_s=second["median_s"] if second else None,
            margin=margin,
            tie=bool(second) and margin <= noise,
            speedup_vs_p2p=(base["p2p"]["median_s"] / best["median_s"]) if "p2p" in base and cp > 1 else None,
            speedup_vs_a2a=(base["a2a"]["median_s"] / best["median_s"]) if "a2a" in base and cp > 1 else None,
            trials=len(key_rows),
            ok_trials=sum(r["status"] == "ok" for r in key_rows),
            incomplete=bool(missing_layouts(key_rows)),
            missing="; ".join(missing_layouts(key_rows)),
            pareto=(pareto or {}).get(SweepKey.of(dict(zip(KEY_FIELDS, key))).name, ""),
            tokens_per_gpu_s=_tokens_per_gpu(dict(zip(KEY_FIELDS, key)), best["median_s"]),
        ).to_dict())
    return out


def _count(v: Any) -> int:
    return 0 if _nan(v) else int(v)


def _tokens_per_gpu(key: dict[str, Any], step_s: float) -> Optional[float]:
    """runner=bridge: tokens per second per GPU of a step of ``step_s`` at the key's m."""
    if key["runner"] != "bridge" or not step_s:
        return None
    dp = int(key["dp"])
    return tokens_per_gpu_s(step_s, m=int(key["micro_batches"]), mbs=int(key["mbs"]), dp=dp,
                            seq=int(key["seq"]),
                            world=int(key["tp"]) * int(key["cp"]) * dp * int(key["pp"]))


def _why_not(r: dict[str, Any]) -> str:
    cls = r.get("failure_class")
    return f"{r['status']} {cls}" if isinstance(cls, str) and cls else str(r["status"])


def missing_layouts(key_rows: list[dict[str, Any]]) -> list[str]:
    """Layouts of a key tried without a valid measurement ("[2,2] cancelled"): the key's
    ranking is incomplete until they are measured. A layout pruned after some measured
    steps counts as measured (it lost); one pruned before any, or cancelled, skipped,
    failed or invalid does not. (A runner=bridge trial pruned at one of its m keeps its
    steps but no median: its steps were not at the user's m.)"""
    measured = {(r["a2a"], r["p2p"]) for r in key_rows
                if (r["status"] == "ok" and r.get("verified"))
                or (r["status"] == "pruned" and (not _nan(r.get("median_s"))
                                                 or _count(r.get("steps")) > 0))}
    why: dict[tuple[int, int], str] = {}
    for r in key_rows:
        k = (r["a2a"], r["p2p"])
        if k not in measured:
            why[k] = _why_not(r)  # the latest row's reason (rows are in trial-id order)
    return [f"[{a},{p}] {w}" for (a, p), w in sorted(why.items())]
