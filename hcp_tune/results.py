"""Results in a notebook: a results folder (or a team's PostgreSQL database, through a
folder that is its view) read as pandas DataFrames with typed columns.

    >>> from hcp_tune import results
    >>> folder = results.folder("results")            # or storage="postgresql://..."
    >>> folder.trials(cp=8, env_tag="te-2.9")         # one row per trial
    >>> folder.steps(cp=8, status="ok")               # one row per measured step
    >>> folder.recommendations(cluster="dgx-h100")    # what ``recommend`` answers
    >>> folder.regress("te-2.9", "te-2.10")           # one row per layout compared

Every method reads what ``sweep`` stored; none re-measures. The columns are those of
``trials.csv`` and ``recommendations.csv`` (docs/reference), typed: integers as nullable
``Int64``, seconds and ratios as ``float64``, flags as ``boolean``, text as ``string``,
``step_times_s`` (and a Bridge trial's ``measured_micro_batches``, ``point_medians_s``)
as lists, ``fingerprint`` and ``phases_s`` as dicts; ``trials`` adds ``layout``
("[a2a,p2p]") and ``started_at``/``finished_at`` (datetimes: when the ledger saw the trial
start and end, the orchestrator's local time; NaT for a row imported without one).

Filters are the sweep key's fields (cluster, model, tp, pp, cp, seq, runner, env_tag, dp,
mbs, micro_batches) and, for trials, ``status``; a list matches any of its values. An
unknown filter, a missing folder, an unusable database or a comparison regress refuses
raise ``ResultsError`` (a ``ValueError``) with one line. The one module of hcp-tune that
imports pandas; plotting is the notebook's own (docs/guides/notebooks.md).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

from hcp_tune.store.records import KEY_FIELDS, Recommendation, TrialRow
from hcp_tune.errors import HcpError

__all__ = ["ResultsError", "Results", "folder", "KEY_FILTERS"]

KEY_FILTERS = tuple(KEY_FIELDS)
LIST_COLUMNS = ("step_times_s", "measured_micro_batches", "point_medians_s")  # JSON lists
DICT_COLUMNS = ("fingerprint", "phases_s")  # JSON objects


class ResultsError(HcpError):
    """The folder, the database or a filter cannot be used as asked: one line."""


def folder(path: str | Path = "results", storage: Optional[str] = None) -> "Results":
    """The results folder at ``path``; ``storage``: a team's database URL (the folder is
    then synced from it first, as ``results sync`` does; the folder remembers it)."""
    return Results(path, storage)


class Results:
    """A results folder, read as DataFrames (the module's docstring says how)."""

    def __init__(self, path: str | Path = "results", storage: Optional[str] = None) -> None:
        from hcp_tune.store import rdb
        from hcp_tune.store.folder import ResultStore

        self.path = Path(path).expanduser().resolve()
        if storage is None and not self.path.is_dir():
            raise ResultsError(f"{path}: no such results folder; give the results_dir a "
                               "sweep wrote to, or storage= a team's database")
        self.storage = storage
        self._store = ResultStore(self.path, storage)
        try:
            if storage is not None:
                self.path.mkdir(parents=True, exist_ok=True)
                self._store.rebuild(storage)  # a view of the database: synced, remembered
            else:
                self._store.refresh()
        except rdb.LedgerUnavailable as e:
            raise ResultsError(str(e)) from None

    def __repr__(self) -> str:
        return f"Results({str(self.path)!r})"

    # ---------------------------------------------------------------- trials
    def trials(self, *, status: Optional[str | Iterable[str]] = None, times: bool = True,
               **key: Any) -> pd.DataFrame:
        """One row per stored trial (every status: ok, failed, invalid, pruned, skipped,
        cancelled), in key then layout then trial order. ``times=False`` leaves out
        ``started_at``/``finished_at`` (they are read from the ledger: a journal folder's
        is replayed, which takes a while for a large one)."""
        _check_filters(key)
        rows = [TrialRow.from_dict(r).to_dict() for r in self._store.rows()]
        rows = [r for r in rows if _matches(r, key)
                and (status is None or r["status"] in _values(status))]
        frame = _typed(pd.DataFrame(rows, columns=_columns(TrialRow, rows)), TrialRow)
        frame.insert(frame.columns.get_loc("a2a"), "layout", pd.Series(
            [f"[{a},{p}]" for a, p in zip(frame["a2a"], frame["p2p"])], dtype="string",
            index=frame.index))
        if times:
            when = self._times()
            for col, i in (("started_at", 0), ("finished_at", 1)):
                frame[col] = pd.to_datetime(pd.Series(
                    [when.get(t, (None, None))[i] for t in frame["trial_id"]],
                    index=frame.index, dtype="object"))
        order = [c for c in (*KEY_FILTERS, "a2a", "p2p", "trial_id") if c in frame]
        return frame.sort_values(order, kind="stable").reset_index(drop=True)

    def steps(self, *, status: Optional[str | Iterable[str]] = "ok",
              **key: Any) -> pd.DataFrame:
        """One row per measured step of each trial (default: the ok ones): the trial's key,
        ``trial_id``, ``layout``, ``a2a``, ``p2p``, ``step`` (0, 1, ...) and
        ``step_time_s``: what a step-time distribution per layout is drawn from."""
        t = self.trials(status=status, times=False, **key)
        keep = [*KEY_FILTERS, "trial_id", "layout", "a2a", "p2p", "step_times_s"]
        long = t[keep].explode("step_times_s").dropna(subset=["step_times_s"])
        long = long.rename(columns={"step_times_s": "step_time_s"})
        long.insert(long.columns.get_loc("step_time_s"), "step",
                    long.groupby(level=0).cumcount().astype("Int64"))
        long["step_time_s"] = long["step_time_s"].astype("float64")
        return long.reset_index(drop=True)

    # ---------------------------------------------------------------- recommendations
    def recommendations(self, **key: Any) -> pd.DataFrame:
        """One row per sweep key: recommendations.csv, the table ``recommend`` answers from
        (the best layout, its figure and interval, the verdict, the runner-up)."""
        _check_filters(key)
        recs = [r for r in self._store.recommendations() if _matches(r, key)]
        frame = pd.DataFrame(recs, columns=_columns(Recommendation, recs))
        return _typed(frame, Recommendation).reset_index(drop=True)

    # ---------------------------------------------------------------- regress
    def regress(self, baseline: str, candidate: str, *, threshold: float = 0.05,
                paired: bool = False, **key: Any) -> pd.DataFrame:
        """One row per (key, layout) measured under both env tags: what ``regress
        baseline=... candidate=...`` judges, with the same options' defaults. ``ratio`` is
        the candidate's step time over the baseline's, ``ci_lo``/``ci_hi`` the judged
        ratio's interval, ``verdict`` ok | regression | improvement | inconclusive |
        failing, ``needed`` the trials per tag that would settle an inconclusive one."""
        from hcp_tune.outputs.regress import model
        from hcp_tune.outputs.regress.args import history_rows
        from hcp_tune.outputs.regress.rows import COMPARED

        _check_filters(key)
        tags = {baseline, candidate}
        rows = [r for r in self._store.tag_rows(tags) if _matches(r, key)]
        try:  # a tag compared with itself, an unknown tag, too few trials: regress's line
            opts = model.Options(baseline=baseline, candidate=candidate, threshold=threshold,
                                 cluster=key.get("cluster"), model=key.get("model"),
                                 design="interleaved" if paired else "sessions")
            report = model.compare(rows, opts, history=history_rows(self.path, tags))
        except HcpError as e:
            raise ResultsError(str(e)) from None
        out = []
        for c in report.comparisons:
            lo, hi = c.ci
            out.append({**dict(zip(COMPARED, c.key)), "layout": c.layout, "a2a": c.a2a,
                        "p2p": c.p2p, "comm_type": c.comm_type,
                        "baseline_trials": len(c.base_s), "candidate_trials": len(c.cand_s),
                        "baseline_median_s": _median(c.base_s),
                        "candidate_median_s": _median(c.cand_s),
                        "ratio": c.ratio, "ci_lo": lo, "ci_hi": hi, "verdict": c.verdict,
                        "mem_ratio": c.mem_ratio, "mem_verdict": c.mem_verdict,
                        "needed": c.needed})
        frame = pd.DataFrame(out, columns=[*COMPARED, *REGRESS_COLUMNS])
        return frame.astype({c: REGRESS_COLUMNS.get(c) or _kind(_KEY_TYPES[c]) for c in frame})

    # ---------------------------------------------------------------- internals
    def _times(self) -> dict[str, tuple[Any, Any]]:
        """trial_id -> (datetime_start, datetime_complete) from the ledger's trials."""
        from hcp_tune.store import studies

        ledger = studies.Ledger(self._store.ledger(self.storage))
        out: dict[str, tuple[Any, Any]] = {}
        for name in ledger.names():
            for t in ledger.study(name).get_trials(deepcopy=False):
                tid = t.user_attrs.get("trial_id")
                if tid is not None:
                    out[tid] = (t.datetime_start, t.datetime_complete)
        return out


# regress's columns after the key's, with their dtypes
REGRESS_COLUMNS = {"layout": "string", "a2a": "Int64", "p2p": "Int64", "comm_type": "string",
                   "baseline_trials": "Int64", "candidate_trials": "Int64",
                   "baseline_median_s": "float64", "candidate_median_s": "float64",
                   "ratio": "float64", "ci_lo": "float64", "ci_hi": "float64",
                   "verdict": "string", "mem_ratio": "float64", "mem_verdict": "string",
                   "needed": "Int64"}
_KEY_TYPES = {f.name: f.type for f in dataclasses.fields(TrialRow) if f.name in KEY_FIELDS}


def _median(values: tuple[float, ...]) -> Optional[float]:
    return float(pd.Series(values, dtype="float64").median()) if values else None


def _check_filters(key: dict[str, Any]) -> None:
    unknown = sorted(set(key) - set(KEY_FILTERS))
    if unknown:
        raise ResultsError(f"{unknown[0]}=: not a filter; filter by the sweep key's fields: "
                           f"{', '.join(KEY_FILTERS)} (trials and steps also by status=)")


def _values(value: Any) -> set:
    items = [value] if isinstance(value, (str, int, float)) else list(value)
    return {str(v) for v in items}


def _matches(row: dict[str, Any], key: dict[str, Any]) -> bool:
    return all(v is None or str(row.get(k)) in _values(v) for k, v in key.items())


def _columns(cls: type, rows: list[dict[str, Any]]) -> list[str]:
    """The record's columns in its order, then any extra field a row holds."""
    names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
    return [*names, *dict.fromkeys(k for r in rows for k in r if k not in names)]


def _kind(annotation: Any) -> Optional[str]:
    """A record field's dtype from its annotation (a string: the records use postponed
    annotations)."""
    text = str(annotation)
    for word, dtype in (("bool", "boolean"), ("float", "float64"), ("int", "Int64"),
                        ("str", "string")):
        if word in text:
            return dtype
    return None


def _typed(frame: pd.DataFrame, cls: type) -> pd.DataFrame:
    for f in dataclasses.fields(cls):
        if f.name not in frame:
            continue
        if f.name in LIST_COLUMNS or f.name in DICT_COLUMNS:
            frame[f.name] = [_parsed(v, f.name in LIST_COLUMNS) for v in frame[f.name]]
        elif (dtype := _kind(f.type)) is not None:
            frame[f.name] = frame[f.name].astype(dtype)
    return frame


def _parsed(value: Any, is_list: bool) -> Any:
    """A JSON list or object stored as text, as a Python list or dict (None for none)."""
    if isinstance(value, (list, dict)):
        return value
    if value is None or (isinstance(value, float) and value != value) or value == "":
        return None if is_list and value is None else ([] if is_list else {})
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return None
