"""``regress``'s statistics: numbers in, estimates and verdicts out (numpy and scipy.special
only; no rows, no printing). ``model.py`` feeds it the per-trial step times of every layout
of one comparison; docs/regress.md explains the rules and their measured error rates.

**The model** (on the log scale, one comparison = one "night"): layout ``i``'s change
``d_i = mean(log cand) - mean(log base)`` (or, paired, the mean of the pairs' differences)
is ``mu + delta_i + e_i``: a **common shift** ``mu`` (the sessions the tags ran in, and a
release-wide change), a **per-layout deviation** ``delta_i`` (what the release did to that
layout, and its own meeting with the sessions), and measurement error ``e_i``.

- **Partial pooling of the noise.** Each layout's within-tag variance has few degrees of
  freedom (8 at 5 trials per tag). It is shrunk toward the night's typical variance by the
  empirical-Bayes rule of limma's moderated t (Smyth 2004): a scaled inverse-chi-square
  prior whose scale ``s0^2`` and degrees of freedom ``d0`` are estimated from all layouts'
  variances; the posterior variance ``(d0 s0^2 + d s^2) / (d0 + d)`` has ``d0 + d`` degrees
  of freedom. A layout implausibly noisy for that prior keeps its own variance and degrees
  of freedom, unshrunk (``moderate(outliers=True)``, as the ranking's), and no layout's
  variance is below the night's pooled variance over every layout (regress's own floor).
- **The session spreads** (``spread.py``): with one session per tag, the two tags' shifts
  differ by N(0, 2 S^2) and each layout's change by N(0, 2 L^2) more, with no release
  change at all. S and L are given, learned from the folder's history or the cluster
  profile's; both are 0 for interleaved pairs (the session cancels).
- **The common shift** is the level of the **reference group**: the layouts most plausibly
  unchanged (``reference_group``). The changes ``d_i`` gather at one or more levels (a
  release that slowed every a2a > 1 layout leaves the a2a = 1 layouts at the session's
  level and the rest 7% above); of the distinct levels held by at least an eighth of the
  layouts, the one most plausible as a pure session shift, N(0, 2 S^2), is the reference.
  Its estimate is the weighted mean of its layouts' ``d_i`` (weights ``1 / (v_i + 2
  L^2)``); tested against 0 with variance ``2 S^2 + var(reference)``, so a release that
  slows every layout is one REGRESSION of the release. Needs ``POOL_MIN`` layouts; with
  fewer, each layout is judged on its whole change, variance ``v_i + 2 S^2 + 2 L^2``.
- **Deviations** ``d_i - reference`` have variance ``v_i + 2 L^2 + var(reference)`` and
  Satterthwaite's degrees of freedom (S and L taken as known, ``v_i`` on the moderated
  degrees of freedom).
- **Verdict** of each estimate (the shift, every deviation, for time and memory alike):
  ``regression`` when the test of "no change" is rejected after Holm's step-down
  correction over **every test of the comparison** (all layouts, both metrics, the shifts)
  at family-wise rate ``alpha`` AND the estimate is beyond the threshold (``log(1 + t)``);
  ``improvement`` likewise below ``log(1 - t)``; ``ok`` when the ``level`` interval lies
  inside ``[log(1 - t), log(1 + t)]``; else ``inconclusive``. The rate controlled is the
  **family-wise error rate**: the chance that any layout (or the shift) that did not change
  is flagged. A layout whose true change sits at the threshold is flagged about half the
  time: the threshold is a size cut on the estimate, not the null hypothesis.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import special

from hcp_tune.stats.shrinkage import SD_FLOOR, moderate, t_quantile, two_sided_p  # noqa: F401

ALPHA = 0.05  # family-wise error rate over every test of one comparison (Holm)
LEVEL = 0.95  # the intervals shown, and the "ok" rule
POOL_MIN = 3  # layouts needed to separate a common shift from per-layout deviations
POWER = 0.8  # the power `regress power` and the INCONCLUSIVE advice plan for
SIM_NIGHTS = 200  # nights simulated per trial count when planning power
MEM_SD = 0.002  # per-trial spread of a device memory reading in those simulations
MEDIAN_EFF = math.pi / 2  # variance of a median of normal estimates / that of their mean
REF_WINDOW = 2.0  # a layout belongs to a level's group within 2 of its sd of that level
REF_MIN_SHARE = 1 / 8  # the reference group: at least this share of the layouts
REF_IMPLAUSIBLE = 3.0  # a level this many sds from 0 is no session shift: smaller groups may do


@dataclass(frozen=True)
class Estimate:
    """A change on the log scale: estimate, standard error, degrees of freedom, the
    two-sided p-value of "no change", Holm's adjusted p, the interval and the verdict."""

    est: float
    se: float
    df: float
    p: float
    p_adj: float = 1.0
    verdict: str = "inconclusive"  # regression | improvement | ok | inconclusive

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        q = t_quantile(1 - (1 - level) / 2, self.df) * self.se
        return self.est - q, self.est + q

    def ratio(self) -> float:
        return math.exp(self.est)

    def ratio_interval(self, level: float = LEVEL) -> tuple[float, float]:
        lo, hi = self.interval(level)
        return math.exp(lo), math.exp(hi)


@dataclass(frozen=True)
class Night:
    """One metric of one comparison: the common shift (None below ``POOL_MIN`` layouts) and
    each layout's deviation from it (its whole change when no shift is separated)."""

    shift: Optional[Estimate]
    layouts: tuple[Estimate, ...]
    s0: float  # the night's typical per-trial relative spread (the prior's scale)
    d0: float  # the prior's degrees of freedom (inf: every layout shares one variance)
    reference: tuple[int, ...] = ()  # the layouts the shift was read from
    session_sd: float = 0.0  # S used
    layout_sd: float = 0.0  # L used






def change(base: Sequence[float], cand: Sequence[float],
           paired: bool = False) -> tuple[float, float, float, float]:
    """(d, per-trial variance s^2, its degrees of freedom, the factor v = s^2 * factor) of
    one layout: the log ratio of geometric means; paired: the mean of the pairs' log
    differences (pairs in the order given, as many as both have)."""
    b, c = np.log(np.asarray(base, float)), np.log(np.asarray(cand, float))
    if paired:
        n = min(len(b), len(c))
        diff = c[:n] - b[:n]
        return float(diff.mean()), float(diff.var(ddof=1)) if n > 1 else 0.0, n - 1, 1 / n
    nb, nc = len(b), len(c)
    ss = float(((b - b.mean()) ** 2).sum() + ((c - c.mean()) ** 2).sum())
    df = nb + nc - 2
    return float(c.mean() - b.mean()), ss / df if df > 0 else 0.0, df, 1 / nb + 1 / nc






def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate)."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def night(changes: Sequence[tuple[float, float, float, float]], session_sd: float = 0.0,
          layout_sd: float = 0.0) -> Night:
    """The reference level (the common shift) and per-layout deviations (unadjusted
    p-values, no verdicts yet) of one metric from each layout's ``change``; ``session_sd``
    and ``layout_sd``: S and L (``spread.py``), 0 where the tags shared their session."""
    d = np.array([c[0] for c in changes], float)
    s2, df = np.array([c[1] for c in changes], float), np.array([c[2] for c in changes], float)
    post, pdf, s0sq, d0 = moderate(s2, df, outliers=True)
    # regress's floor (not the ranking's): no layout is taken for quieter than the night's
    # pooled spread over every layout. The ranking's moderation leaves its noisiest fifth
    # out of the prior and floors the rest at their own pooled spread, which runs low when
    # every layout shares one noise: 7% of A/A nights flagged at 5 trials, not 3%
    pooled = float((df * s2).sum() / df.sum()) if df.sum() > 0 else 0.0
    v = np.maximum(post, pooled) * np.array([c[3] for c in changes], float)
    pdf = np.asarray(pdf, float)
    w = v + 2 * layout_sd ** 2  # a layout's change around its group's level
    s2 = 2 * session_sd ** 2  # the two tags' sessions: their shifts differ by N(0, 2 S^2)
    if len(d) < POOL_MIN:
        ests = tuple(_estimate(float(x), math.sqrt(wi + s2), _df(vi, dfi, wi + s2))
                     for x, vi, wi, dfi in zip(d, v, w, pdf))
        return Night(None, ests, math.sqrt(s0sq), d0, (), session_sd, layout_sd)
    members = reference_group(d, w, s2)
    weight = 1 / w[members]
    level = float((d[members] * weight).sum() / weight.sum())
    var_ref = float(1 / weight.sum())
    df_ref = float(pdf[members].sum())
    shift = _estimate(level, math.sqrt(s2 + var_ref), _df(var_ref, df_ref, s2 + var_ref))
    ests = tuple(_estimate(float(x - level), math.sqrt(wi + var_ref), _df(vi, dfi, wi + var_ref))
                 for x, vi, wi, dfi in zip(d, v, w, pdf))
    return Night(shift, ests, math.sqrt(s0sq), d0, tuple(int(i) for i in members),
                 session_sd, layout_sd)


def _df(estimated: float, df: float, total: float) -> float:
    """Satterthwaite's degrees of freedom of ``total`` = ``estimated`` (on ``df``) + known
    terms (the spreads S and L are taken as known)."""
    if estimated <= 0 or not math.isfinite(df):
        return math.inf
    return float(min(1e7, df * (total / estimated) ** 2))


def groups(d: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """The levels the layouts' changes gather at: from each layout, the set of layouts
    within ``REF_WINDOW`` standard deviations (``sqrt(w)``) of a level, moved to their
    weighted mean until the set stops changing (a mean shift); distinct sets, largest
    first."""
    found: dict[tuple, np.ndarray] = {}
    sd = np.sqrt(w)
    for start in d:
        level, members = float(start), None
        for _ in range(50):
            inside = np.abs(d - level) <= REF_WINDOW * sd
            if members is not None and (inside == members).all():
                break
            members = inside
            weight = 1 / w[inside]
            level = float((d[inside] * weight).sum() / weight.sum())
        idx = np.flatnonzero(members)
        found[tuple(idx)] = idx
    return sorted(found.values(), key=len, reverse=True)


def reference_group(d: np.ndarray, w: np.ndarray, s2: float) -> np.ndarray:
    """The layouts the night's common shift is read from: of the groups (``groups``) with at
    least ``REF_MIN_SHARE`` of the layouts (and ``POOL_MIN``) whose levels are distinct (a
    smaller group within ``REF_WINDOW`` typical sds of a larger one's level is the same
    level: never chosen for being nearer 0), the one whose level is most plausible as a
    pure session shift, N(0, 2 S^2 + its own variance); a release that
    slowed most layouts leaves the unchanged ones as the reference, one that slowed all of
    them leaves one group, its shift then tested against 0. No group that large: all."""
    apart = REF_WINDOW * math.sqrt(float(np.median(w)))

    def modes(least: int) -> list[tuple[np.ndarray, float, float]]:
        out: list[tuple[np.ndarray, float, float]] = []  # distinct levels, largest first
        for g in groups(d, w):
            weight = 1 / w[g]
            level = float((d[g] * weight).sum() / weight.sum())
            if len(g) >= least and all(abs(level - m[1]) > apart for m in out):
                out.append((g, level, math.sqrt(s2 + 1 / weight.sum())))
        return out

    big = modes(max(POOL_MIN, math.ceil(REF_MIN_SHARE * len(d))))
    best = min(big, key=lambda m: abs(m[1]) / m[2]) if big else None
    if best is None or abs(best[1]) / best[2] > REF_IMPLAUSIBLE:
        # no large group is plausible as a session shift (a paired night, whose session
        # cancels, or one key's 4 layouts with 3 slowed): a smaller group at a plausible
        # level is the unchanged one, else the large group stays (a release-wide change)
        small = [m for m in modes(1) if abs(m[1]) / m[2] <= REF_IMPLAUSIBLE]
        best = min(small, key=lambda m: abs(m[1]) / m[2]) if small else best
    return best[0] if best is not None else np.arange(len(d))


def _estimate(est: float, se: float, df: float) -> Estimate:
    se = max(se, 1e-12)
    return Estimate(est, se, df, two_sided_p(est / se, df))


def judge(e: Estimate, p_adj: float, threshold: float, alpha: float = ALPHA,
          level: float = LEVEL) -> Estimate:
    """``e`` with Holm's adjusted p and its verdict (the module docstring's rule)."""
    up, down = math.log1p(threshold), math.log1p(-min(threshold, 0.99))
    lo, hi = e.interval(level)
    if p_adj <= alpha and e.est > up:
        said = "regression"
    elif p_adj <= alpha and e.est < down:
        said = "improvement"
    elif lo >= down and hi <= up:
        said = "ok"
    else:
        said = "inconclusive"
    return Estimate(e.est, e.se, e.df, e.p, p_adj, said)


def judge_all(nights: Sequence[Night], threshold: Sequence[float], alpha: float = ALPHA,
              level: float = LEVEL) -> list[Night]:
    """Every estimate of every night judged, Holm's correction over all of them at once."""
    flat = [(k, e) for k, n in enumerate(nights)
            for e in ((n.shift,) if n.shift else ()) + n.layouts]
    adj = holm([e.p for _, e in flat])
    judged = [judge(e, a, threshold[k], alpha, level) for (k, e), a in zip(flat, adj)]
    out, i = [], 0
    for n in nights:
        shift = None
        if n.shift:
            shift, i = judged[i], i + 1
        out.append(Night(shift, tuple(judged[i:i + len(n.layouts)]), n.s0, n.d0, n.reference,
                         n.session_sd, n.layout_sd))
        i += len(n.layouts)
    return out


def z_holm_first(alpha: float, tests: int) -> float:
    """The |z| Holm's first step needs: the conservative bar a planned test must clear."""
    return float(special.ndtri(1 - alpha / (2 * max(1, tests))))


def power_at(n: int, effect: float, sd: float, threshold: float, alpha: float, tests: int,
             layouts: int = 48) -> float:
    """P(a layout changed by ``effect`` (0.07 = 7% slower, -0.07 faster) is confirmed) at
    ``n`` trials per tag and per-trial relative spread ``sd``: the normal approximation of
    ``judge`` with Holm's first-step bar (conservative)."""
    e = abs(math.log1p(effect))
    cut = math.log1p(threshold) if effect > 0 else -math.log1p(-min(threshold, 0.99))
    se = sd * math.sqrt(2 / n) * math.sqrt(1 + MEDIAN_EFF / max(layouts, 1))
    bar = max(cut, z_holm_first(alpha, tests) * se)
    return float(special.ndtr((e - bar) / se))


def simulated_power(n: int, effect: float, sd: float, threshold: float, alpha: float = ALPHA,
                    layouts: int = 48, changed: int = 0, nights: int = SIM_NIGHTS,
                    seed: int = 0, session_sd: float = 0.0, layout_sd: float = 0.0) -> float:
    """The share of changed layouts this module's rule confirms: ``nights`` simulated
    nights of ``layouts`` layouts, ``n`` trials per tag with per-trial relative spread
    ``sd``, ``changed`` of them (default one in eight) changed by ``effect``, a memory
    reading per trial (0.2% spread) judged in the same Holm family as time; each tag's
    session shifts every layout by N(0, ``session_sd``) and each layout by N(0,
    ``layout_sd``) more, and the rule is told those spreads."""
    rng = np.random.default_rng(seed)
    changed = changed or max(1, round(layouts / 8))
    shift = math.log1p(effect)
    want = "regression" if effect > 0 else "improvement"
    hits = 0
    for _ in range(nights):
        base, cand = rng.normal(0, sd, (2, layouts, n))
        cand[:changed] += shift
        if session_sd or layout_sd:
            base += rng.normal(0, session_sd) + rng.normal(0, layout_sd, (layouts, 1))
            cand += rng.normal(0, session_sd) + rng.normal(0, layout_sd, (layouts, 1))
        mem = rng.normal(0, MEM_SD, (2, layouts, n))
        judged = judge_all([night(_changes(base, cand), session_sd, layout_sd),
                            night(_changes(*mem))],
                           [threshold, threshold], alpha)
        hits += sum(e.verdict == want for e in judged[0].layouts[:changed])
    return hits / (nights * changed)


def _changes(base: np.ndarray, cand: np.ndarray) -> list[tuple[float, float, float, float]]:
    """``change`` of every layout (rows of log step times), vectorised."""
    nb, nc = base.shape[1], cand.shape[1]
    ss = ((base - base.mean(1, keepdims=True)) ** 2).sum(1) + (
        (cand - cand.mean(1, keepdims=True)) ** 2).sum(1)
    d = cand.mean(1) - base.mean(1)
    df = nb + nc - 2
    return [(float(x), float(v) / df, df, 1 / nb + 1 / nc) for x, v in zip(d, ss)]


@functools.lru_cache(maxsize=256)
def trials_for_power(effect: float, sd: float, threshold: float, alpha: float = ALPHA,
                     tests: int = 97, layouts: int = 48, power: float = POWER,
                     cap: int = 1000, nights: int = SIM_NIGHTS, session_sd: float = 0.0,
                     layout_sd: float = 0.0) -> Optional[int]:
    """The fewest trials per tag (>= 3) at which ``simulated_power`` reaches ``power``;
    None when no number up to ``cap`` does (a change at or within the threshold never is).
    The normal approximation ``power_at`` gives the first guess (it is optimistic: it
    leaves out the estimated spread of deviations and the t quantiles), the simulation
    the answer; ``tests`` is only the approximation's."""
    if abs(effect) <= threshold:
        return None
    if sd <= 0:
        return 3
    sim = lambda k: simulated_power(k, effect, sd, threshold, alpha, layouts,  # noqa: E731
                                    nights=nights, session_sd=session_sd, layout_sd=layout_sd)
    lo = 3
    while lo < cap and power_at(lo, effect, sd, threshold, alpha, tests, layouts) < power:
        lo += 1
    lo = max(3, lo - 1)
    if sim(lo) >= power:
        return lo
    hi = lo
    while sim(hi) < power:  # grow until enough, then bisect between lo and hi
        lo, hi = hi, min(cap, math.ceil(hi * 1.5) + 1)
        if lo == cap:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if sim(mid) >= power else (mid, hi)
    return hi


def trials_to_clear(effect: float, sd: float, threshold: float, level: float = LEVEL,
                    power: float = POWER, cap: int = 1000, layout_sd: float = 0.0
                    ) -> Optional[int]:
    """The fewest trials per tag at which a change of ``effect`` (inside the threshold)
    gets an interval inside +/- threshold with ``power``; None beyond ``cap``, or when the
    layout x session spread (``layout_sd``, which no trial averages away) alone is too
    wide."""
    gap = math.log1p(threshold) - abs(math.log1p(effect))
    z = float(special.ndtri(1 - (1 - level) / 2)) + float(special.ndtri(power))
    room = (gap / z) ** 2 - 2 * layout_sd ** 2  # what the trials' own noise may use
    if gap <= 0 or room <= 0:
        return None
    if sd <= 0:
        return 3
    n = math.ceil(2 * sd ** 2 / room)
    return max(3, n) if n <= cap else None


def obf_spent(t: float, alpha: float = ALPHA) -> float:
    """Lan-DeMets O'Brien-Fleming spending: the error rate spent by information fraction
    ``t`` (0..1): ``2 - 2 Phi(z_{alpha/2} / sqrt(t))``."""
    if t <= 0:
        return 0.0
    z = float(special.ndtri(1 - alpha / 2))
    return float(2 - 2 * special.ndtr(z / math.sqrt(min(t, 1.0))))


def look_alpha(t_now: float, t_before: float, alpha: float = ALPHA) -> float:
    """The family-wise rate a look at information ``t_now`` may spend after the looks up to
    ``t_before``: the increments add up to ``alpha`` at most (Bonferroni over the looks)."""
    return max(obf_spent(t_now, alpha) - obf_spent(t_before, alpha), 0.0)
