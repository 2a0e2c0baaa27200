"""Which layouts a sweep measures again, decided from what is stored (pure).

What belongs here: how many trials a layout has toward ``search.repeats``, which layouts
are out of the running, and, with ``search.adaptive`` (the default), the next round of an
undecided key. Every kept layout first gets ``search.min_repeats`` trials (the plan,
``sweep_plan.plan_sweep``); then, round by round, only the layouts not yet separated from
the best (``verdict.decide``: the key is *unsettled*) get one more trial each, up to
``search.repeats``; a key stops when it is settled or a tie. ``search.adaptive=false``:
every layout gets ``search.repeats`` trials. Both decide from the stored rows alone, so a
resumed sweep decides the same as one that ran through.

A trial counts toward ``search.repeats`` only when it is ok with a median (``counts``);
pruned, cancelled and failed trials never do. A layout is out of the running (no more
trials) when early stopping pruned it (it lost on every step it ran), the cost model
skipped it, or its stored failures stand (``search.retry``) and it has no trial that
counts, or has failed ``search.repeats`` times.
"""
from __future__ import annotations

from typing import Any, Iterable

from hcp_tune.stats import verdict

def counts(row: dict[str, Any]) -> bool:
    """A trial that counts toward ``search.repeats``: ok with a median (an ok trial whose
    CP check is missing counts too, though it enters no figure: measuring it again would
    not prove more)."""
    median = row.get("median_s")
    return row.get("status") == "ok" and median is not None and median == median


def usable_counts(rows: Iterable[dict[str, Any]]) -> dict[int, int]:
    """Per a2a size, the trials that count toward ``search.repeats``."""
    out: dict[int, int] = {}
    for r in rows:
        if counts(r):
            out[int(r["a2a"])] = out.get(int(r["a2a"]), 0) + 1
    return out


def closed(rows: Iterable[dict[str, Any]], repeats: int = 1) -> set[int]:
    """The a2a sizes out of the running: pruned by early stopping, skipped by the cost
    model, or failed (failed or invalid trials, as given: the caller leaves out those
    ``search.retry`` measures again) with no trial that counts, or ``repeats`` times."""
    rows = list(rows)
    usable = usable_counts(rows)
    failed: dict[int, int] = {}
    out: set[int] = set()
    for r in rows:
        a2a, status = int(r["a2a"]), r.get("status")
        if status == "skipped" or (status == "pruned"
                                   and not (r.get("error") or "").startswith("cancelled")):
            out.add(a2a)
        elif status in ("failed", "invalid"):
            failed[a2a] = failed.get(a2a, 0) + 1
            if not usable.get(a2a) or failed[a2a] >= repeats:
                out.add(a2a)
    return out


def next_round(rows: list[dict[str, Any]], kept: Iterable[int], *, min_repeats: int,
               repeats: int, tie_threshold: float) -> list[int]:
    """The a2a sizes to measure once more now (an empty list: the key is done). A layout
    still short of ``min_repeats`` gets its trial first; then, while the key is unsettled,
    each undecided layout below ``repeats``."""
    kept = list(kept)
    out = closed([r for r in rows if r.get("failure_class") != "environment"], repeats)
    have = usable_counts(rows)
    short = [a for a in kept if a not in out and have.get(a, 0) < min_repeats]
    if short:
        return short
    v = verdict.decide(rows, tie_threshold)
    if v.kind != "unsettled" or v.best is None:
        return []
    return [a for a, _ in v.undecided
            if a in kept and a not in out and have.get(a, 0) < repeats]
