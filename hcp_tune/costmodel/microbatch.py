"""A short Bridge run that ranks like the full batch: two micro-batch counts per layout, a
line through them, and the ranking at the user's micro-batch count.

With 1F1B a training step is about ``(m + pp - 1) * t_mb + T_fixed``: ``m = gbs / (mbs*dp)``
micro-batches, ``pp - 1`` of bubble, and ``T_fixed`` (the optimizer step, the exposed
data-parallel reduce-scatter / all-gather, which share inter-node links with the CP ring)
that is not the same for every layout. A short run at ``m = pp`` makes the bubble about half
the step and spreads ``T_fixed`` over ``pp`` micro-batches instead of hundreds, so the gaps
"vs best", early stopping and ties read shrink or even reorder. Measuring each layout at
several ``m`` and fitting ``step = a + b*m`` separates the two: ``b`` is the steady per-micro-batch
time, ``a`` the bubble and fixed part; the step at the user's ``m`` is ``a + b*m``.

Three points, ``pp``, ``2*pp`` and ``3*pp``: two fit any line exactly, so a step that is not
linear in m (a data-loader or memory effect that appears at 3*pp) would go unseen; the
third point's residual is compared with the noise the points' own steps show
(``StepFit.linearity``). The fit's uncertainty at the user's m (the points' noise carried
through the extrapolation, about ``sigma * sqrt(sum c_i^2)``, 1.6-1.9x one point's noise
at m = 512) is ``StepFit.se_at``; the trial's p10/p90 are widened by it
(``engine.trials.combine``). All points are multiples of ``pp`` (the interleaved schedule,
with virtual pipeline stages, needs ``m % pp == 0``), at least ``pp``: 1F1B keeps
``min(pp, m)`` micro-batches in flight, so at ``m >= pp`` the measured peak memory is the
full run's.

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

POINT_FACTORS = (1, 2, 3)  # m = pp, 2*pp, 3*pp: a line through three, the third checks it
Z90 = 1.2816  # the standard normal's 90th percentile: p10/p90 are median -/+ Z90 sigma
SE_MEDIAN = 1.2533  # the standard error of a median of n normal steps: 1.2533 sigma/sqrt(n)
LINEARITY_Z = 3.0  # a residual beyond 3 sigma of its own noise is not noise
LINEARITY_FLOOR = 0.01  # ... nor one beyond 1% of the step there (smaller never reorders)


def measure_points(pp: int, user_m: int) -> tuple[int, ...]:
    """The micro-batch counts to measure: ``pp``, ``2*pp`` and ``3*pp``, never above the
    user's m (a run at the user's m needs no extrapolation: then it alone is measured)."""
    if pp < 1 or user_m < 1:
        raise ValueError(f"measure_points: expected pp >= 1 and user_m >= 1, got {pp=}, {user_m=}")
    points = tuple(sorted({min(user_m, pp * f) for f in POINT_FACTORS}))
    return points if points[-1] < user_m else (user_m,)


@dataclass(frozen=True)
class StepFit:
    """``step_s = fixed_s + per_micro_batch_s * m`` through a layout's measured points, with
    each point's standard error (``point_se_s``; zeros when only medians were given)."""

    fixed_s: float  # a: the bubble and the fixed part (optimizer, exposed DP collectives)
    per_micro_batch_s: float  # b: the steady time of one micro-batch through a stage
    points: tuple[tuple[int, float], ...]  # (m, median step seconds) measured
    point_se_s: tuple[float, ...] = ()  # the standard error of each point's median

    def step_s(self, m: int) -> float:
        return self.fixed_s + self.per_micro_batch_s * m

    def _weights(self, m: float) -> list[float]:
        """c_i with step_s(m) = sum c_i t_i (ordinary least squares)."""
        ms = [p[0] for p in self.points]
        n, mean = len(ms), sum(ms) / len(ms)
        sxx = sum((x - mean) ** 2 for x in ms)
        return [1 / n + (m - mean) * (x - mean) / sxx for x in ms]

    def residuals_s(self) -> list[float]:
        return [t - self.step_s(m) for m, t in self.points]

    def residual_sd_s(self) -> list[float]:
        """Each residual's standard deviation from the points' noise alone (a line)."""
        ses = self.point_se_s or (0.0,) * len(self.points)
        out = []
        for i, (m, _) in enumerate(self.points):
            c = self._weights(m)
            out.append(math.sqrt(sum(((1.0 if j == i else 0.0) - c[j]) ** 2 * ses[j] ** 2
                                     for j in range(len(c)))))
        return out

    def se_at(self, m: int) -> float:
        """The standard error of ``step_s(m)``: the points' noise carried through the
        extrapolation, or (larger) the scatter of the points about the line, when a third
        point gives a degree of freedom to read it from."""
        c = self._weights(m)
        ses = self.point_se_s or (0.0,) * len(self.points)
        from_noise = math.sqrt(sum((ci * se) ** 2 for ci, se in zip(c, ses)))
        dof = len(self.points) - 2
        if dof < 1:
            return from_noise
        sigma = math.sqrt(sum(r * r for r in self.residuals_s()) / dof)
        return max(from_noise, sigma * math.sqrt(sum(ci * ci for ci in c)))

    def linearity(self) -> Optional[str]:
        """None when the points lie on a line within their noise; else why not: the worst
        residual beyond ``LINEARITY_Z`` of its own noise and beyond ``LINEARITY_FLOOR`` of
        the step there. Two points always fit (nothing to check)."""
        if len(self.points) < 3:
            return None
        worst = None
        for (m, t), r, sd in zip(self.points, self.residuals_s(), self.residual_sd_s()):
            if abs(r) > LINEARITY_Z * sd and abs(r) > LINEARITY_FLOOR * t:
                if worst is None or abs(r) > abs(worst[1]):
                    worst = (m, r, sd, t)
        if worst is None:
            return None
        m, r, sd, t = worst
        ms = ", ".join(str(p[0]) for p in self.points)
        return (f"step = a + b*m does not fit the runs at m={ms}: at m={m} the step is "
                f"{r:+.4g} s ({100 * r / t:+.1f}%) off the line, "
                + (f"{abs(r) / sd:.1f}x its noise ({sd:.2g} s)" if sd else "with no step noise")
                + " (a data-loader or memory effect that is not linear in m)")

    def as_dict(self, user_m: int) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "per_micro_batch_s": self.per_micro_batch_s,
                "points": [list(p) for p in self.points], "user_m": user_m,
                "step_at_user_m_s": self.step_s(user_m), "se_at_user_m_s": self.se_at(user_m),
                "residuals_s": self.residuals_s()}


def median_ses(medians: list[float], steps: list[list[float]]) -> list[float]:
    """The standard error of each run's median step, ``SE_MEDIAN * sigma_i / sqrt(n_i)``,
    with one relative sigma pooled over the runs (their relative sample variances, weighted
    by n_i - 1): five steps alone estimate a sigma too loosely to judge a residual by, and
    the runs of one trial share one allocation and one step-to-step jitter. Zeros with
    fewer than two steps in every run."""
    num = den = 0.0
    for med, xs in zip(medians, steps):
        if len(xs) >= 2 and med:
            mean = sum(xs) / len(xs)
            var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
            num += var / (med * med) * (len(xs) - 1)
            den += len(xs) - 1
    if not den:
        return [0.0] * len(medians)
    rel = math.sqrt(num / den)
    return [SE_MEDIAN * rel * med / math.sqrt(len(xs)) if xs else 0.0
            for med, xs in zip(medians, steps)]


def fit_step(points: Iterable[tuple[int, float]],
             steps: Optional[Iterable[Iterable[float]]] = None) -> StepFit:
    """Least squares through (m, seconds); at least two distinct m are needed. ``steps``:
    each point's measured steps (same order as ``points``), for the points' noise."""
    given = [(int(m), float(t)) for m, t in points]
    ses = (median_ses([t for _, t in given], [[float(x) for x in xs] for xs in steps])
           if steps is not None else [0.0] * len(given))
    order = sorted(range(len(given)), key=lambda i: given[i])
    pts = tuple(given[i] for i in order)
    ms = {m for m, _ in pts}
    if len(ms) < 2:
        raise ValueError(f"fit_step: need step times at two micro-batch counts, got m={sorted(ms)}")
    n = len(pts)
    mean_m = sum(m for m, _ in pts) / n
    mean_t = sum(t for _, t in pts) / n
    b = (sum((m - mean_m) * (t - mean_t) for m, t in pts)
         / sum((m - mean_m) ** 2 for m, _ in pts))
    return StepFit(fixed_s=mean_t - b * mean_m, per_micro_batch_s=b, points=pts,
                   point_se_s=tuple(ses[i] for i in order))


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
