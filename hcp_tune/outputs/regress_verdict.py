"""``regress``'s evidence rules: the bootstrap interval of a ratio, the verdict it supports,
how many trials would likely settle an inconclusive layout, and which rows' memory is a
real per-trial measurement.

Pure functions of numbers and stored rows (standard library only); ``regress.py`` applies
them key by key and layout by layout. Why these rules and defaults, with the measured
false-alarm rate and power: docs/regress.md and benchmarks/RESULTS-regress-error-rates.md.

- **Verdict from the interval**, never from the point ratio alone. With ``bound`` the
  tolerance (max(threshold, noise floor) by default):

  ===========================================  ==============
  the whole interval above 1 + bound           ``regression``
  the whole interval below 1 - bound           ``improvement`` (unexpected: CP off looks fast)
  the whole interval inside [1 - bound, 1 + bound]  ``ok``
  otherwise (it straddles an edge)             ``inconclusive``
  ===========================================  ==============

- **Trials to settle** an inconclusive layout: the interval's half-width shrinks as
  1/sqrt(n). With each tag's relative spread ``s`` (its noise, the p10-p90 half-width,
  / 1.2816, the normal's z of p90) and the standard error of a median (1.2533 s/sqrt(n)),
  the half-width at n trials per tag is about ``z * 1.2533 * sqrt((s_b^2 + s_c^2) / n)``;
  the answer is the smallest n at which that is below the ratio's distance to the nearest
  tolerance edge. An estimate from the observed spread ("likely"), capped by the caller.
"""
from __future__ import annotations

import math
import random
from typing import Any, Mapping, Optional, Sequence

from hcp_tune.noise import noise, percentile

BOOTSTRAP_N = 2000
CI_LEVEL = 0.95
Z_P90 = 1.2816  # the standard normal's 90th percentile: p10-p90 half-width = 1.2816 sigma
MEDIAN_SE = 1.2533  # sqrt(pi/2): the standard error of a median is 1.2533 sigma/sqrt(n)

# What a row's ``mem_note`` says when its peak memory is a device reading (the job's
# bench.py: the CUDA allocator; the Bridge runner: device memory used or max reserved)
DEVICE_MEMORY_NOTES = ("torch.cuda.", "max_memory_allocated", "max_memory_reserved",
                       "device memory used")


def median(values: Sequence[float]) -> float:
    """The median (``percentile(values, 50)``), without the general percentile's cost."""
    xs = sorted(values)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def bootstrap_ratio_ci(base: Sequence[float], cand: Sequence[float], *, seed: int,
                       n: int = BOOTSTRAP_N, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(cand)/median(base), resampling each tag's
    per-trial medians with replacement, independently; ``random.Random(seed)``."""
    rng = random.Random(seed)
    base, cand = list(base), list(cand)
    nb, nc = len(base), len(cand)
    ratios = [median(rng.choices(cand, k=nc)) / median(rng.choices(base, k=nb))
              for _ in range(n)]
    tail = (1 - level) / 2 * 100
    return percentile(ratios, tail), percentile(ratios, 100 - tail)


def verdict(lo: float, hi: float, bound: float) -> str:
    """``regression`` | ``improvement`` | ``ok`` | ``inconclusive`` from the interval."""
    if lo > 1 + bound:
        return "regression"
    if hi < 1 - bound:
        return "improvement"
    if lo >= 1 - bound and hi <= 1 + bound:
        return "ok"
    return "inconclusive"


def _z(level: float) -> float:
    """The two-sided standard normal quantile of ``level`` (bisection on erf)."""
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def trials_to_settle(base: Sequence[float], cand: Sequence[float], ratio: float,
                     bound: float, *, level: float = CI_LEVEL, cap: int) -> Optional[int]:
    """Trials per tag that would likely make the interval clear every tolerance edge;
    None when more than ``cap`` would be needed (the change is about the tolerance)."""
    s2 = sum((noise(list(v)) / Z_P90) ** 2 for v in (base, cand))
    gap = min(abs(ratio - (1 + bound)), abs(ratio - (1 - bound)))
    have = max(len(base), len(cand))
    if s2 == 0:  # no spread observed: one more trial each shows whether there is any
        return have + 1 if have + 1 <= cap else None
    if gap <= 0:
        return None
    n = math.ceil((_z(level) * MEDIAN_SE * math.sqrt(s2) / gap) ** 2)
    n = max(n, have + 1)
    return n if n <= cap else None


def memory_not_measured(row: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> Optional[str]:
    """Why a row's ``peak_mem_bytes`` is not a per-trial device measurement, or None when
    it is. Read from what the row records: its ``mem_note`` (what the job measured), and,
    for an older row without one, the fingerprint's ``gpu`` (older GPU rows hold the CUDA
    allocator's peak; older CPU rows the process's peak-RSS growth)."""
    value = row.get("peak_mem_bytes")
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "no memory figure recorded"
    note = str(row.get("mem_note") or "")
    if note:
        if any(mark in note for mark in DEVICE_MEMORY_NOTES):
            return None
        return f"not a per-trial device measurement ({note.split(',')[0]})"
    if fingerprint.get("gpu"):
        return None
    return "not a per-trial device measurement (no GPU in the row's fingerprint)"
