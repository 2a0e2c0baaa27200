"""Partial pooling of noise across the layouts of one comparison, and the t distribution
(numpy and scipy.special only; no rows). Two users, one rule: ``verdict`` (the layouts of
one key in one sweep, each layout's spread of log trial medians) and ``regress`` (each
layout's within-tag spread; ``outputs/regress/stats.py`` explains the model).

**Moderated variances** (limma's empirical-Bayes rule, Smyth 2004): each layout's sample
variance, on few degrees of freedom (2 at 3 trials), is shrunk toward the comparison's
typical variance: a scaled inverse-chi-square prior whose scale ``s0^2`` and degrees of
freedom ``d0`` are estimated from every layout's variance; the posterior variance
``(d0 s0^2 + d s^2) / (d0 + d)`` has ``d0 + d`` degrees of freedom. A layout noisier than
the rest keeps much of its own variance; one with a single trial (d = 0) gets the prior's.
The layouts of one sweep share the machine, the session and the software, which is why
their spreads are alike enough to pool.

**The median's variance** (``median_factor``): n times the variance of the median of n
normal samples over the samples' variance (1 at n = 1 and 2, 1.346 at 3, 1.434 at 5,
pi/2 for large n; computed once here by 2,000,000 draws per n and rounded).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import numpy as np


def _special() -> Any:
    """scipy.special, imported on first use: `plan` and `validate` import this module and
    must stay quick on a login node (tests/test_cli.py checks they import no scipy)."""
    from scipy import special

    return special


OUTLIER_P = 0.2  # moderate(outliers=True): a variance beyond this F tail keeps its own
SD_FLOOR = 1e-3  # smallest per-trial relative spread assumed (device memory is often exact)
VAR_SPREAD_MAX = 100.0  # a layout's variance counts as at least the night's median / this
# n * var(median of n) / var(one), normal samples, n = 1..10; pi/2 beyond
_MEDIAN_FACTOR = (1.0, 1.0, 1.346, 1.19, 1.434, 1.287, 1.475, 1.343, 1.496, 1.384)


def median_factor(n: int) -> float:
    """n * var(median of n normal samples) / their variance."""
    return _MEDIAN_FACTOR[n - 1] if 1 <= n <= len(_MEDIAN_FACTOR) else math.pi / 2


def t_quantile(p: float, df: float) -> float:
    special = _special()
    return float(special.ndtri(p)) if not math.isfinite(df) or df > 1e6 else float(
        special.stdtrit(df, p))


def two_sided_p(z: float, df: float) -> float:
    special = _special()
    if not math.isfinite(df) or df > 1e6:
        return float(2 * special.ndtr(-abs(z)))
    return float(2 * special.stdtr(df, -abs(z)))


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (Newton's method on 1/trigamma, as limma does)."""
    special = _special()
    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = float(special.polygamma(1, x))
        step = tri * (1 - tri / y) / float(special.polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


def moderate(s2: Sequence[float], df: Sequence[float], *, outliers: bool = False
             ) -> tuple["np.ndarray", "np.ndarray", float, float]:
    """limma's moderated variances: (posterior s^2, its df, prior s0^2, prior d0).

    ``outliers=True`` (the ranking's): a layout whose own variance is implausibly large for
    the prior (its upper-tail F(d, d0) p-value below ``OUTLIER_P``) keeps its own variance
    and degrees of freedom, unshrunk, and the prior is estimated from the others without
    the 3-MAD clip (which hid such a layout's variance and then shrank it fully). Its
    posterior df is then its own d: ``df_post - d`` is the prior weight each layout got.
    The others' posterior is at least their pooled variance (``_moderate_robust``)."""
    import numpy as np

    if outliers:
        return _moderate_robust(s2, df)
    special = _special()
    s2 = np.maximum(np.asarray(s2, float), SD_FLOOR ** 2)
    # a variance far below the night's (identical readings on few trials) is not evidence
    # of a quiet layout, and on the log scale it would drag the prior's scale down
    s2 = np.maximum(s2, float(np.median(s2)) / VAR_SPREAD_MAX)
    df = np.asarray(df, float)
    ok = df > 0
    if ok.sum() < 2:
        return s2, df, float(np.median(s2)), 0.0
    e = np.log(s2[ok]) - special.digamma(df[ok] / 2) + np.log(df[ok] / 2)
    # robust to a layout or two of odd variance (Phipson et al. 2016 in spirit): clip the
    # log-variances at 3 MADs around their median before the moments are taken
    mid = float(np.median(e))
    spread = 3 * 1.4826 * float(np.median(np.abs(e - mid))) or math.inf
    e = np.clip(e, mid - spread, mid + spread)
    ebar = float(e.mean())
    n = int(ok.sum())
    excess = float(np.mean((e - ebar) ** 2 * n / (n - 1) - special.polygamma(1, df[ok] / 2)))
    cap = float(df[ok].sum())  # never more prior information than the night holds
    if excess > 0:
        d0 = min(2 * _trigamma_inverse(excess), cap)
        s0sq = math.exp(ebar + float(special.digamma(d0 / 2)) - math.log(d0 / 2))
    else:
        d0, s0sq = cap, math.exp(ebar)
    post = np.where(ok, (d0 * s0sq + df * s2) / (d0 + df), s0sq)
    return np.maximum(post, SD_FLOOR ** 2), df + d0, s0sq, d0


def _moderate_robust(s2: Sequence[float], df: Sequence[float]
                     ) -> tuple["np.ndarray", "np.ndarray", float, float]:
    """``moderate(outliers=True)``: flag the layouts whose variance the prior (fitted to
    all) makes implausible, refit the prior to the rest, and leave the flagged unshrunk."""
    import numpy as np

    special = _special()
    s2 = np.asarray(s2, float)
    df = np.asarray(df, float)
    keep = np.ones(len(s2), bool)
    for _ in range(3):  # a refit can expose another: at most three passes
        post, pdf, s0sq, d0 = moderate(s2[keep], df[keep])
        if d0 <= 0:
            break
        ratio = np.maximum(s2, SD_FLOOR ** 2) / s0sq
        p = np.where(df > 0, special.fdtrc(np.maximum(df, 1e-9), d0, ratio), 1.0)
        flag = (p < OUTLIER_P) & (df > 0)
        if not (flag & keep).any() or (~flag).sum() < 2:
            break
        keep = ~flag
    own = ~keep
    post_all = np.where(own, np.maximum(s2, SD_FLOOR ** 2),
                        (d0 * s0sq + df * np.maximum(s2, SD_FLOOR ** 2)) / (d0 + df))
    post_all = np.where((df <= 0) & keep, s0sq, post_all)
    # no layout is taken for quieter than the others' pooled spread: a layout whose few
    # trials happened to land together (both in one mode of a bimodal machine, none in a
    # heavy tail) would otherwise get an interval far too narrow, and the spread of the
    # log-variances those cases cause also shrinks d0, so moderation alone does not help
    pooled = float((df[keep] * s2[keep]).sum() / df[keep].sum()) if df[keep].sum() > 0 else 0.0
    post_all = np.where(keep, np.maximum(post_all, pooled), post_all)
    return np.maximum(post_all, SD_FLOOR ** 2), np.where(own, df, df + d0), s0sq, d0
