"""How sure a key's ranking is: each layout's figure with its 95% interval, and the key's
verdict, ``settled``, ``tie`` or ``unsettled``, with what would settle it.

What belongs here: pure functions of one key's stored rows (no files, no config). The same
code ranks the tables (``tables.recommendations``), decides which layouts an adaptive sweep
measures again (``sweep_adaptive``) and is replayed by ``benchmarks/decision_cost.py``, so
what the benchmark measures is what users run.

**The figure** of a layout is the median of its verified ok trials' medians. Its 95%
interval is ``log(median) +- t(df) * sqrt(var)``: ``var`` the larger of ``factor(n) * sd^2
/ n`` and the median's own jackknife variance (``jackknife_var``: a median that can jump
between two modes, or out of a heavy tail, widens its interval), ``sd`` the spread of the
layout's log trial medians moderated across the key's layouts (``shrinkage.moderate`` with
``outliers=True``: with 2 or 3 trials a layout's own spread is a poor guess, and the
layouts of one sweep share its machine and session; a layout whose spread the others make
implausible keeps its own, and no other is taken for quieter than their pooled spread),
``df`` its moderated degrees of freedom, ``factor(n)`` the variance of a median of n over
that of one trial. Deterministic: the same rows give the same interval, so a resumed
sweep decides the same. Not a bootstrap: a percentile bootstrap of a median over 3 trials
is about the trials' range and covers the true median 75% of the time (50% at 2, 93% at
5). The trial, not the step, is the unit: a trial's steps share one allocation, one
placement and one warm-up, so pooling them would count the same allocation's luck
hundreds of times (docs/guides/ranking.md argues it with numbers). Pruned, cancelled,
skipped and failed trials never enter a figure. How often each layout's interval holds
its true median, per noise regime: benchmarks/RESULTS-interval-coverage.md.

**The verdict** compares the best layout (lowest figure) with every other measured layout
through the interval of the ratio other/best (the log ratio +- t * the root of the two
figures' variances, on Satterthwaite's degrees of freedom with the prior counted once:
``ratio_df``), at the level of the look (``look_level``): an adaptive sweep looks after
every round, so the 5% error is spent over its looks (2% at n = 2, 1% at each of 3, 4 and
5; a settle command's later look spends 1% more), and a key decided at any look was
decided at that look's share. *settled* when every ratio's
interval lies above 1; *tie* when every layout not separated from the best has a ratio
interval inside 1 +- ``tie_threshold``; *unsettled* otherwise, with the undecided layouts
and the trials a power calculation says they need (``trials_to_decide``). A layout early
stopping ended (``trials.should_prune``: every step >= 10% slower than the best) without an
interval of its own is outside the claim: the verdict names it and compares nothing with
it. Every verdict is about the sweep's own session (its machine, its day). How often each
kind is wrong, per noise regime, measured through the real sweep loop (runner=synthetic)
on regimes and seeds not used to build the rule: benchmarks/RESULTS-decision-cost.md.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from hcp_tune.stats import shrinkage

LEVEL = 0.95  # the intervals' coverage
POWER_Z = 0.8416  # one-sided z of 80% power (and the 20% quantile of the spread bound)
INTERVAL_Z = 1.96  # two-sided z of 95%
TIE_THRESHOLD = 0.02  # search.tie_threshold's default
MIN_TRIALS = 2  # a layout with fewer trials has no interval (one trial says nothing of spread)
Layout = tuple[int, int]


@dataclass(frozen=True)
class Figure:
    """A layout's step time: the median of its trials' medians and its 95% interval (None
    with fewer than ``MIN_TRIALS`` trials); ``row``: the trial at the (upper) median, what
    early stopping compares with; ``medians``: its trials' medians in trial order;
    ``sd_log``/``df``: the moderated spread of its log trial medians and its degrees of
    freedom (None without an interval)."""

    layout: Layout
    median_s: float
    ci_lo_s: Optional[float]
    ci_hi_s: Optional[float]
    medians: tuple[float, ...]
    row: dict[str, Any] = field(compare=False, repr=False)
    sd_log: Optional[float] = None
    df: Optional[float] = None
    prior_df: float = 0.0  # the prior's weight in sd_log (0: unshrunk, an outlier)
    s0sq: Optional[float] = None  # the prior's scale (the key's typical variance)

    @property
    def n_trials(self) -> int:
        return len(self.medians)

    @property
    def peak_mem_bytes(self) -> Optional[int]:
        return self.row.get("peak_mem_bytes")

    @property
    def var_log(self) -> Optional[float]:
        """The variance of log(median_s): the spread over n times the median's factor, or
        the median's own jackknife variance where that is larger (``jackknife_var``)."""
        if self.sd_log is None:
            return None
        normal = shrinkage.median_factor(self.n_trials) * self.sd_log ** 2 / self.n_trials
        return max(normal, jackknife_var(self.medians))


def jackknife_var(medians: tuple[float, ...]) -> float:
    """The jackknife variance of the median of the log trial medians (0 below 3 trials).

    The moderated spread says how far a median of n normal trials strays; it does not see
    a median that can jump: trials from a machine with two modes (a slow node in some
    allocations) or one heavy tail, where removing one trial moves the median across the
    gap. Leaving each trial out in turn sees exactly that, and the interval then widens
    where it must (benchmarks/interval_coverage.py: the bimodal and unequal-noise rows)."""
    n = len(medians)
    if n < 3:
        return 0.0
    logs = [math.log(m) for m in medians]
    loo = [statistics.median(logs[:i] + logs[i + 1:]) for i in range(n)]
    mean = sum(loo) / n
    return (n - 1) / n * sum((x - mean) ** 2 for x in loo)


@dataclass(frozen=True)
class Verdict:
    """A key's verdict: ``kind`` settled | tie | unsettled; ``figures`` fastest first;
    ``ratios``: per other layout, the (lo, hi) 95% interval of its figure over the best's;
    ``pruned``: layouts that lost by early stopping (no figure); ``undecided``: the
    layouts still to measure (the best first) when unsettled; ``more_trials``: per
    undecided layout, how many more trials the power calculation asks for; ``lighter``:
    in a tie, the tied layout with the least peak memory."""

    kind: str
    figures: list[Figure]
    ratios: dict[Layout, tuple[float, float]]
    pruned: list[Layout] = field(default_factory=list)
    undecided: list[Layout] = field(default_factory=list)
    more_trials: dict[Layout, int] = field(default_factory=dict)
    lighter: Optional[Layout] = None
    tie_threshold: float = TIE_THRESHOLD
    level: float = LEVEL  # the confidence of the ratios and the verdict (``look_level``)

    @property
    def best(self) -> Optional[Figure]:
        return self.figures[0] if self.figures else None

    @property
    def tied(self) -> list[Layout]:
        """In a tie, the best and every layout not separated from it."""
        if self.kind != "tie" or not self.best:
            return []
        return [self.best.layout, *(f.layout for f in self.figures[1:]
                                    if f.layout in self.ratios
                                    and self.ratios[f.layout][0] <= 1.0)]


def is_missing(v: Any) -> bool:
    """None or NaN: a figure a row does not have."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def usable(row: dict[str, Any]) -> bool:
    """A trial that enters a figure, counts toward ``search.repeats`` and is compared by
    ``regress``: ok, verified (CP was active) and with a positive median."""
    m = row.get("median_s")
    return (row.get("status") == "ok" and bool(row.get("verified"))
            and isinstance(m, (int, float)) and not is_missing(m) and math.isfinite(m)
            and m > 0)


def _t(df: float, level: float = LEVEL) -> float:
    return shrinkage.t_quantile(1 - (1 - level) / 2, df)


# the error each look may spend, by the most trials a compared layout has: an adaptive
# sweep with the default search.repeats=5 looks at n = 2, 3, 4 and 5 (5% in all); a look
# beyond (a settle command's) spends 1% more of its own
LOOK_ALPHA = {2: 0.02, 3: 0.01, 4: 0.01, 5: 0.01}
LATER_LOOK_ALPHA = 0.01


def look_level(n: int) -> float:
    """The confidence level of the verdict at a look where the layouts compared have up to
    ``n`` trials each. An adaptive sweep looks after every round and stops a key at the
    first look that decides it, so each look gets a share of the 5% error (a weighted
    Bonferroni over the looks: no assumption about how they depend on each other), the
    first the most because most keys are decided there. The share depends on n alone, so a
    verdict means the same however its rows were gathered (a sweep that measured every
    layout 5 times and looked once is held to the n = 5 share)."""
    return 1 - LOOK_ALPHA.get(max(n, MIN_TRIALS), LATER_LOOK_ALPHA)


def _with_intervals(figs: list[Figure]) -> list[Figure]:
    """Each figure with ``MIN_TRIALS`` or more trials gets its moderated spread and its
    95% interval: log(median) +- t(df) * sqrt(factor(n) / n) * sd (``shrinkage``, with a
    layout far noisier than the rest left unshrunk: ``moderate(outliers=True)``)."""
    have = [f for f in figs if f.n_trials >= MIN_TRIALS]
    if not have:
        return figs
    s2 = [statistics.variance([math.log(m) for m in f.medians]) for f in have]
    post, pdf, s0sq, _ = shrinkage.moderate(s2, [f.n_trials - 1 for f in have], outliers=True)
    done = {}
    for f, v, d in zip(have, post, pdf):
        g = replace(f, sd_log=math.sqrt(float(v)), df=float(d),
                    prior_df=float(d) - (f.n_trials - 1), s0sq=float(s0sq))
        half = _t(g.df) * math.sqrt(g.var_log)
        done[f.layout] = replace(g, ci_lo_s=f.median_s * math.exp(-half),
                                 ci_hi_s=f.median_s * math.exp(half))
    return [done.get(f.layout, f) for f in figs]


def figures(rows: list[dict[str, Any]], intervals: bool = True) -> list[Figure]:
    """Per measured layout of one key, its figure, fastest first (peak memory breaks ties);
    ``intervals=False``: without the intervals (what early stopping needs, per trial)."""
    by: dict[Layout, list[dict[str, Any]]] = {}
    for r in rows:
        if usable(r):
            by.setdefault((int(r["a2a"]), int(r["p2p"])), []).append(r)
    out = []
    for layout, rs in by.items():
        medians = tuple(float(r["median_s"]) for r in rs)
        mid = sorted(rs, key=lambda r: r["median_s"])[len(rs) // 2]  # the upper median's
        out.append(Figure(layout, statistics.median(medians), None, None, medians, mid))
    if intervals:
        out = _with_intervals(out)
    return sorted(out, key=lambda f: (f.median_s, f.peak_mem_bytes or 0, f.layout))


def ratio_df(best: Figure, other: Figure) -> float:
    """Satterthwaite's degrees of freedom of var_best + var_other with the prior counted
    once: each moderated variance is the prior's part (d0 df, shared by both layouts) and
    the layout's own (its n - 1 df) in proportion to their weights, so the sum is three
    independent parts, not two each holding d0."""
    parts = []  # (expected size, df) of each independent part
    prior = 0.0
    for f in (best, other):
        own = f.n_trials - 1
        w0 = f.prior_df / (f.prior_df + own) if f.prior_df + own > 0 else 1.0
        prior += w0 * (f.var_log or 0.0)
        parts.append(((1 - w0) * (f.var_log or 0.0), own))
    d0 = max(best.prior_df, other.prior_df)
    parts.append((prior, d0))
    total = sum(a for a, _ in parts)
    denom = sum(a * a / d for a, d in parts if a > 0 and d > 0)
    return total * total / denom if denom > 0 else 1.0


def ratio_interval(best: Figure, other: Figure, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` interval of other/best: log ratio +- t * sqrt(var_best + var_other), on
    ``ratio_df``'s degrees of freedom; (0, inf) when either has no interval."""
    vb, vo = best.var_log, other.var_log
    if vb is None or vo is None or not best.df or not other.df:
        return (0.0, math.inf)
    half = _t(ratio_df(best, other), level) * math.sqrt(vb + vo)
    d = math.log(other.median_s / best.median_s)
    return math.exp(d - half), math.exp(d + half)


def _pruned(rows: list[dict[str, Any]], measured: set[Layout]) -> list[Layout]:
    """Layouts early stopping stopped (a trial ``pruned``, not cancelled), but ``measured``."""
    return sorted({(int(r["a2a"]), int(r["p2p"])) for r in rows
                   if r.get("status") == "pruned"
                   and not (r.get("error") or "").startswith("cancelled")} - measured)


def _chi2_lower(df: float) -> float:
    """The 20% quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    h = 2.0 / (9.0 * df)
    return df * max(0.05, 1 - h - POWER_Z * math.sqrt(h)) ** 3


def trials_to_decide(best: Figure, other: Figure, tie_threshold: float) -> int:
    """Trials per layout (in all) at which the pair should settle or tie with 80% power.

    The normal approximation of a ratio of two medians of n trials each: the interval of
    log(other/best) at the level of the look at n (``look_level``) has half-width
    ``z(n) * sqrt(2 * pi/2) * s / sqrt(n)`` (s: the two layouts' moderated spread of log
    trial medians at its 80% upper bound: a spread estimated from few trials is often an
    underestimate). To settle, that half-width must be below |log ratio| with 80% power;
    to tie, below the distance from |log ratio| to log(1 + threshold). The smallest n at
    which either holds (benchmarks/power_rule.py checks the suggestion at scale)."""
    if best.sd_log is None or other.sd_log is None:
        return MIN_TRIALS + 1
    df = min(best.df or 1.0, other.df or 1.0)
    s = math.sqrt((best.sd_log ** 2 + other.sd_log ** 2) / 2) * math.sqrt(df / _chi2_lower(df))
    d = abs(math.log(other.median_s / best.median_s))
    se1 = math.sqrt(2 * math.pi / 2) * s  # the s.e. of the log ratio at n = 1
    gaps = [g for g in (d, math.log1p(tie_threshold) - d) if g > 1e-9]
    if not gaps:
        return 10_000
    now = max(best.n_trials, other.n_trials)
    for n in range(now + 1, 10_001):
        z = _t(math.inf, look_level(n)) + POWER_Z
        if any((z * se1 / g) ** 2 <= n for g in gaps):
            return max(MIN_TRIALS + 1, n)
    return 10_000


def decide(rows: list[dict[str, Any]], tie_threshold: float = TIE_THRESHOLD) -> Verdict:
    """One key's verdict from its stored rows (any order; pure, deterministic), at the
    level of its look (``look_level`` of the most trials a compared layout has)."""
    shown = figures(rows)
    # stopped early with no interval of its own: outside the verdict's claim (one with an
    # interval, from MIN_TRIALS ok trials, is judged by it); shown last, compared with none
    pruned = _pruned(rows, {f.layout for f in shown if f.n_trials >= MIN_TRIALS})
    figs = [f for f in shown if f.layout not in pruned]
    if not figs:
        return Verdict("unsettled", shown, {}, pruned, tie_threshold=tie_threshold)
    best, others = figs[0], figs[1:]
    figs = figs + [f for f in shown if f.layout in pruned]
    level = look_level(max(f.n_trials for f in figs))
    ratios = {f.layout: ratio_interval(best, f, level) for f in others}
    close = [f for f in others if ratios[f.layout][0] <= 1.0]  # not separated from the best
    if not others and not pruned:  # one layout measured: nothing was compared, and more
        # trials of it cannot change that (no layout is undecided: adaptive rounds stop)
        return Verdict("unsettled", figs, ratios, pruned, tie_threshold=tie_threshold,
                       level=level)
    if not close and (best.n_trials >= MIN_TRIALS or not others):
        kind = "settled"
    elif close and all(1 - tie_threshold <= ratios[f.layout][0]
                       and ratios[f.layout][1] <= 1 + tie_threshold for f in close):
        kind = "tie"
    else:
        kind = "unsettled"
    if kind == "tie":
        tied = [best, *close]
        lighter = min(tied, key=lambda f: (f.peak_mem_bytes or 0, f.median_s)).layout
        return Verdict(kind, figs, ratios, pruned, lighter=lighter, tie_threshold=tie_threshold,
                       level=level)
    if kind == "settled":
        return Verdict(kind, figs, ratios, pruned, tie_threshold=tie_threshold, level=level)
    pending = close or others
    need = {f.layout: trials_to_decide(best, f, tie_threshold) for f in pending}
    best_need = max(need.values(), default=MIN_TRIALS + 1)
    more = {best.layout: max(0, best_need - best.n_trials)}
    more.update({f.layout: max(0, need[f.layout] - f.n_trials) for f in pending})
    return Verdict(kind, figs, ratios, pruned,
                   undecided=[best.layout, *(f.layout for f in pending)],
                   more_trials=more, tie_threshold=tie_threshold, level=level)


def summary(v: Verdict) -> str:
    """The verdict in one line, with its error rate's source (docs/guides/ranking.md)."""
    if v.best is None:
        return "unsettled: no layout measured yet"
    b = v.best.layout
    if v.kind == "settled":
        compared = len(v.ratios)
        text = f"settled: [{b[0]},{b[1]}] is fastest"
        if compared:
            text += (f"; every other measured layout is slower at {v.level:.2%} confidence "
                     "(this look's share of the sweep's 5%)")
        if v.pruned:
            names = " ".join(f"[{a},{p}]" for a, p in v.pruned)
            text += (f"; {names} stopped early, every step >= 10% slower: not part of the "
                     "confidence claim")
        return text + "; for this sweep's session"
    if v.kind == "tie":
        names = " ".join(f"[{a},{p}]" for a, p in v.tied)
        lt = v.lighter
        return (f"tie within {v.tie_threshold:.0%}: {names}; [{lt[0]},{lt[1]}] uses the least "
                "memory")
    if not v.undecided:
        return f"unsettled: only [{b[0]},{b[1]}] has a usable measurement: nothing to compare"
    names = " ".join(f"[{a},{p}]" for a, p in v.undecided)
    more = max(v.more_trials.values(), default=0)
    return f"unsettled: {names} not yet separated; about {more} more trial(s) each"
