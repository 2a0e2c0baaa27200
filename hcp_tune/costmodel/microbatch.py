"""A short Bridge run that ranks like the full batch: two micro-batch counts per layout, a
line through them, and the ranking at the user's micro-batch count.

With 1F1B a training step is about ``(m + pp - 1) * t_mb + T_fixed``: ``m = gbs / (mbs*dp)``
micro-batches, ``pp - 1`` of bubble, and ``T_fixed`` (the optimizer step, the exposed
data-parallel reduce-scatter / all-gather, which share inter-node links with the CP ring)
that is not the same for every layout. A short run at ``m = pp`` makes the bubble about half
the step and spreads ``T_fixed`` over ``pp`` micro-batches instead of hundreds, so the gaps
"vs best", early stopping and ties read shrink or even reorder. Measuring each layout at two
``m`` and fitting ``step = a + b*m`` separates the two: ``b`` is the steady per-micro-batch
time, ``a`` the bubble and fixed part; the step at the user's ``m`` is ``a + b*m``.

Both points are multiples of ``pp`` (the interleaved schedule, with virtual pipeline stages,
needs ``m % pp == 0``), at least ``pp``: 1F1B keeps ``min(pp, m)`` micro-batches in flight,
so at ``m >= pp`` the measured peak memory is the full run's.

Keys with different pp or dp are compared by tokens per second per GPU at the user's m
(``tokens_per_gpu_s``): their step times are not for the same work or the same GPUs.
What belongs here: the points to measure, the fit, the extrapolation, the ranking over
recorded rows (plain dicts with ``a2a``, ``p2p``, ``median_s``, ``measured_micro_batches`` and
``point_medians_s``). The sweep measures the points and combines them into one row per
trial (``engine/trials.combine``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

POINT_FACTORS = (1, 3)  # m = pp and m = 3*pp: the bubble's share differs threefold


def measure_points(pp: int, user_m: int) -> tuple[int, ...]:
    """The micro-batch counts to measure: ``pp`` and ``3*pp``, never above the user's m
    (a run at the user's m needs no extrapolation: then it alone is measured)."""
    if pp < 1 or user_m < 1:
        raise ValueError(f"measure_points: expected pp >= 1 and user_m >= 1, got {pp=}, {user_m=}")
    points = tuple(sorted({min(user_m, pp * f) for f in POINT_FACTORS}))
    return points if points[-1] < user_m else (user_m,)


@dataclass(frozen=True)
class StepFit:
    """``step_s = fixed_s + per_micro_batch_s * m`` through a layout's measured points."""

    fixed_s: float  # a: the bubble and the fixed part (optimizer, exposed DP collectives)
    per_micro_batch_s: float  # b: the steady time of one micro-batch through a stage
    points: tuple[tuple[int, float], ...]  # (m, median step seconds) measured

    def step_s(self, m: int) -> float:
        return self.fixed_s + self.per_micro_batch_s * m

    def as_dict(self, user_m: int) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "per_micro_batch_s": self.per_micro_batch_s,
                "points": [list(p) for p in self.points], "user_m": user_m,
                "step_at_user_m_s": self.step_s(user_m)}


def fit_step(points: Iterable[tuple[int, float]]) -> StepFit:
    """Least squares through (m, seconds); at least two distinct m are needed."""
    pts = tuple(sorted((int(m), float(t)) for m, t in points))
    ms = {m for m, _ in pts}
    if len(ms) < 2:
        raise ValueError(f"fit_step: need step times at two micro-batch counts, got m={sorted(ms)}")
    n = len(pts)
    mean_m = sum(m for m, _ in pts) / n
    mean_t = sum(t for _, t in pts) / n
    b = (sum((m - mean_m) * (t - mean_t) for m, t in pts)
         / sum((m - mean_m) ** 2 for m, _ in pts))
    return StepFit(fixed_s=mean_t - b * mean_m, per_micro_batch_s=b, points=pts)


def tokens_per_gpu_s(step_s: float, *, m: int, mbs: int, dp: int, seq: int, world: int) -> float:
    """Tokens trained per second per GPU: the step's m*mbs*dp sequences of seq tokens."""
    return m * mbs * dp * seq / step_s / world


def _layout(row: dict[str, Any]) -> tuple[int, int, int, int, int]:
    return (int(row["a2a"]), int(row["p2p"]), int(row.get("tp", 1)), int(row.get("pp") or 1),
            int(row.get("dp") or 1))


def _json_list(value: Any) -> list:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    try:
        out = json.loads(value)
    except (TypeError, ValueError):
        return []
    return out if isinstance(out, list) else [out]


def row_points(row: dict[str, Any]) -> list[tuple[int, float]]:
    """(m, median step seconds) a row measured: a sweep's row carries every point of its
    trial (``measured_micro_batches`` with ``point_medians_s``); a row of one run (one m,
    ``median_s`` measured there) gives that one point."""
    ms = [int(m) for m in _json_list(row.get("measured_micro_batches"))]
    medians = _json_list(row.get("point_medians_s"))
    if len(ms) == len(medians) and ms:
        return [(m, float(t)) for m, t in zip(ms, medians) if isinstance(t, (int, float))]
    if len(ms) == 1 and isinstance(row.get("median_s"), (int, float)):
        return [(ms[0], float(row["median_s"]))]
    return []


def layout_fits(rows: list[dict[str, Any]]) -> dict[tuple, StepFit]:
    """Per layout (a2a, p2p, tp, pp, dp), the fit through its ok rows' median step times at
    their measured micro-batch counts (the median over repeats at the same m)."""
    by: dict[tuple, dict[int, list[float]]] = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("median_s") is None:
            continue
        for m, t in row_points(r):
            by.setdefault(_layout(r), {}).setdefault(m, []).append(t)
    out = {}
    for key, per_m in by.items():
        if len(per_m) >= 2:
            pts = [(m, sorted(ts)[len(ts) // 2]) for m, ts in per_m.items()]
            out[key] = fit_step(pts)
    return out


def rank_at(rows: list[dict[str, Any]], user_m: int, *, mbs: int = 1,
            seq: Optional[int] = None) -> list[dict[str, Any]]:
    """The layouts ranked at the user's m, best first: by tokens/s per GPU (which equals
    ranking by step time when pp and dp agree), each with its fit. Layouts measured at only
    one m are left out (they cannot be extrapolated)."""
    ranked = []
    for (a2a, p2p, tp, pp, dp), fit in layout_fits(rows).items():
        step = fit.step_s(user_m)
        cp = a2a * p2p
        tok = tokens_per_gpu_s(step, m=user_m, mbs=mbs, dp=dp, seq=seq or 1,
                               world=tp * cp * dp * pp)
        ranked.append({"a2a": a2a, "p2p": p2p, "tp": tp, "pp": pp, "dp": dp,
                       "step_at_user_m_s": step, "tokens_per_gpu_s": tok,
                       "fit": fit.as_dict(user_m)})
    return sorted(ranked, key=lambda r: -r["tokens_per_gpu_s"])
