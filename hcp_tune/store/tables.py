"""The two tables of a results folder as text: ``trials.csv`` (a row per stored trial) and
``recommendations.csv`` (a recommendation per sweep key), and how a key is ranked.

What belongs here: pure functions of rows, no files. A cell's text depends on its value
alone (``csv_cell``), so a key's lines can be derived on their own and spliced into the
tables (``table_entry``; ``store.ResultStore.rebuild`` does the splicing and the files);
``read_cell`` reads a cell back. ``rank`` orders one key's layouts by their figures (``verdict``);
``recommendations`` makes one recommendation per key; ``missing_layouts`` says which of a
key's layouts still lack a valid measurement.
"""
from __future__ import annotations

import csv
import io
import math
from typing import Any, Optional

from hcp_tune.costmodel.microbatch import tokens_per_gpu_s
from hcp_tune.stats import verdict
from hcp_tune.store.records import (
    KEY_FIELDS,
    RECOMMENDATION_COLUMNS,
    TRIAL_COLUMNS,
    Recommendation,
    SweepKey,
    key_field,
)


_TEXT_CELLS = frozenset({"cluster", "model", "runner", "env_tag", "comm_type", "runner_up",
                         "missing", "pareto", "verdict", "tied", "lighter", "undecided"})


def read_cell(column: str, cell: Optional[str]) -> Any:
    """A table cell as the value it was written from (``csv_cell``): empty is None; text
    columns stay text; True/False, integers and floats (``1073741824.0``, as an older
    table's pandas wrote it, reads as a float) are parsed. The csv module, not pandas:
    ``recommend`` reads this one file, and importing pandas was most of its second."""
    if cell is None or cell == "":
        return None
    if column in _TEXT_CELLS:
        return cell
    if cell in ("True", "False"):
        return cell == "True"
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


def csv_cell(v: Any) -> Any:
    """A table cell's text from the value alone: empty for None or NaN, ``repr`` for a
    float (``0.05``, ``2.0``), ``str`` for the rest. (pandas formatted a column's floats
    from the whole column, so one row's text depended on the others.)"""
    if verdict.is_missing(v):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v if isinstance(v, str) else str(v)


def csv_line(values: list[Any]) -> str:
    """One CSV line (minimal quoting, ``\n``), each cell by ``csv_cell``."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([csv_cell(v) for v in values])
    return buf.getvalue()


def quoted_cell(cell: str) -> str:
    """One cell as ``csv_line`` writes it among others (minimal quoting)."""
    if any(ch in cell for ch in ',"\n\r'):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def table_entry(rows: list[dict[str, Any]], pareto: str) -> dict[str, Any]:
    """A key's part of the tables: its rows as text (each row's trials.csv columns, and
    its extra fields, whose columns are known once every key is derived), its
    recommendation's line and sort order, and its rows' extra columns in order."""
    recs = recommendations(rows, {SweepKey.of(rows[0]).name: pareto}) if rows else []
    order = str(tuple(key_field(recs[0], k) for k in KEY_FIELDS)) if recs else ""
    return {"rows": [(csv_line([r.get(c) for c in TRIAL_COLUMNS])[:-1],
                      {k: v for k, v in r.items() if k not in TRIAL_COLUMNS}) for r in rows],
            "rec": csv_line([recs[0][c] for c in RECOMMENDATION_COLUMNS]) if recs else "",
            "order": order,
            "extras": list(dict.fromkeys(k for r in rows for k in r if k not in TRIAL_COLUMNS))}


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured layout of one key, a row whose ``median_s`` is the layout's figure (the
    median of its verified ok trials' medians, ``verdict.figures``), fastest first (memory
    breaks ties); the rest of the row is its median trial's."""
    return [{**f.row, "median_s": f.median_s} for f in verdict.figures(rows)]


def _name(layout: Optional[tuple[int, int]]) -> str:
    return f"[{layout[0]},{layout[1]}]" if layout else ""


def recommendations(rows: list[dict[str, Any]],
                    pareto: Optional[dict[str, str]] = None,
                    tie_threshold: float = verdict.TIE_THRESHOLD) -> list[dict[str, Any]]:
    """One recommendation per sweep key that has at least one ranked (ok) trial, with its
    verdict (``verdict.decide``); ``pareto``: per key name, its study's Pareto front
    (``studies.Ledger.pareto``)."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(tuple(key_field(r, k) for k in KEY_FIELDS), []).append(r)
    out = []
    for key, key_rows in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        v = verdict.decide(key_rows, tie_threshold)
        if v.best is None:
            continue
        best = v.best
        second = v.figures[1] if len(v.figures) > 1 else None
        ratio = v.ratios.get(second.layout) if second else None
        base = {f.row["comm_type"]: f for f in v.figures}
        cp = best.row["cp"]

        def speedup(kind: str) -> Optional[float]:
            return base[kind].median_s / best.median_s if kind in base and cp > 1 else None

        out.append(Recommendation(
            **dict(zip(KEY_FIELDS, key)),
            a2a=best.layout[0],
            p2p=best.layout[1],
            comm_type=best.row["comm_type"],
            median_s=best.median_s,
            ci_lo_s=best.ci_lo_s,
            ci_hi_s=best.ci_hi_s,
            n_trials=best.n_trials,
            verdict=v.kind,
            peak_mem_bytes=best.peak_mem_bytes,
            runner_up=_name(second.layout) if second else "",
            runner_up_median_s=second.median_s if second else None,
            ratio_ci_lo=ratio[0] if ratio and math.isfinite(ratio[1]) else None,
            ratio_ci_hi=ratio[1] if ratio and math.isfinite(ratio[1]) else None,
            margin=(second.median_s / best.median_s - 1) if second else None,
            tie=v.kind == "tie",
            tied=" ".join(_name(t) for t in v.tied),
            lighter=_name(v.lighter),
            undecided=" ".join(_name(u) for u in v.undecided),
            more_trials=max(v.more_trials.values()) if v.more_trials else None,
            speedup_vs_p2p=speedup("p2p"),
            speedup_vs_a2a=speedup("a2a"),
            trials=len(key_rows),
            ok_trials=sum(r["status"] == "ok" for r in key_rows),
            incomplete=bool(missing_layouts(key_rows)),
            missing="; ".join(missing_layouts(key_rows)),
            pareto=(pareto or {}).get(SweepKey.of(dict(zip(KEY_FIELDS, key))).name, ""),
            tokens_per_gpu_s=_tokens_per_gpu(dict(zip(KEY_FIELDS, key)), best.median_s),
            stopped_early=" ".join(_name(p) for p in v.pruned),
            level=v.level if v.ratios else None,
        ).to_dict())
    return out


def _count(v: Any) -> int:
    return 0 if verdict.is_missing(v) else int(v)


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
                or (r["status"] == "pruned" and (not verdict.is_missing(r.get("median_s"))
                                                 or _count(r.get("steps")) > 0))}
    why: dict[tuple[int, int], str] = {}
    for r in key_rows:
        k = (r["a2a"], r["p2p"])
        if k not in measured:
            why[k] = _why_not(r)  # the latest row's reason (rows are in trial-id order)
    return [f"[{a},{p}] {w}" for (a, p), w in sorted(why.items())]
