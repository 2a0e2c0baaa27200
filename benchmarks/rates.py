"""The 95% Wilson interval of a rate k/n: the one interval every benchmark's error rates use
(decision_cost.py, power_rule.py, regress_error_rates.py)."""
from __future__ import annotations

import math

Z = 1.96


def wilson(k: int, n: int) -> tuple[float, float]:
    """(lo, hi) of the 95% Wilson score interval of k successes in n; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + Z * Z / n
    mid = (p + Z * Z / (2 * n)) / d
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def rate(k: int, n: int) -> str:
    """k/n with its 95% Wilson interval, e.g. '96.7% [95.7%, 97.4%]'; '-' when n is 0."""
    if n == 0:
        return "-"
    lo, hi = wilson(k, n)
    return f"{k / n:.1%} [{lo:.1%}, {hi:.1%}]"
