"""One definition of measurement noise, used wherever hcp-tune asks "is this difference
real?" within one trial: early stopping (``trials.should_prune``) and the regression noise
floor between software stacks. (A recommendation's verdict compares layouts over their
trials: ``engine/verdict.py``.)

Standard library only: the job side summarises its steps with the same ``percentile``.

The noise of a set of timings is the **relative half-width of its p10-p90 band**:
``(p90 - p10) / (2 * median)``. For the steps of one trial that is the step-to-step jitter
inside one allocation; for the per-trial medians of repeated trials of one layout it is
the allocation-to-allocation variation (what ``search.repeats`` measures). A difference
between two timings counts as real only when it is larger than the noise of both.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100 inclusive, but got {q=}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def band_noise(median: Optional[float], p10: Optional[float], p90: Optional[float]) -> float:
    """``(p90 - p10) / (2 * median)``; 0.0 when any of them is unknown (NaN or None)."""
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (median, p10, p90)):
        return 0.0
    if not median:
        return 0.0
    return (p90 - p10) / (2 * median)


def noise(values: Sequence[float]) -> float:
    """The noise of a set of timings (steps of a trial, or per-trial medians)."""
    if len(values) < 2:
        return 0.0
    return band_noise(percentile(values, 50), percentile(values, 10), percentile(values, 90))


def row_noise(row: Mapping[str, Any]) -> float:
    """The noise of a stored trial row, from its ``median_s``/``p10_s``/``p90_s``."""
    return band_noise(row.get("median_s"), row.get("p10_s"), row.get("p90_s"))
