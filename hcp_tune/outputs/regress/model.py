"""``regress``: compare what two environment tags measured, key by key and layout by layout.

Reads stored rows only; never measures, never imports torch or pandas. ``compare`` groups
the rows into layouts measured under both tags and hands their per-trial numbers to
``stats`` (the common shift, per-layout deviations, Holm's correction); everything here is
a pure function of the rows, so the verdicts are tested on recorded rows.

- **The unit is the trial**: its ``median_s`` (the median of its measured steps, warm-up
  discarded). Only trials that ended ``ok`` and proved CP active (``verified``) count; a
  layout needs ``MIN_TRIALS`` of them under each tag, for time and memory alike.
- **Design.** ``sessions`` (the default): each tag measured in its own session; the common
  shift then holds the session effect as well as a release-wide change, and the output
  says so. ``interleaved`` (``regress run``, or ``paired=true``): the tags' trials
  alternated ABBA in one allocation; the r-th trial of each tag form a pair and the session
  effect cancels in the pair's difference.
- **Memory**: judged only where both tags' rows hold a per-trial device reading
  (``rows.memory_not_measured``), with the same model, interval and trials as time.
- **Winner** of a key under a tag: the layout with the lowest median of per-trial medians;
  a changed winner is reported and does not by itself change the exit code.
- **Exit code**: 1 when anything is confirmed (a layout's or the common shift's regression
  or unexpected improvement, a failing layout); else 4 when something is inconclusive;
  else 0. Bad input: 2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from hcp_tune.errors import EXIT_FINDINGS, EXIT_INCONCLUSIVE, EXIT_OK
from hcp_tune.noise import noise, percentile
import hcp_tune.outputs.regress.stats as stats
from hcp_tune.outputs.regress.spread import Spread, resolve
from hcp_tune.outputs.regress.rows import (
    COMPARED,
    RegressError,
    drift_warnings,
    fingerprint_of,
    injected_warnings,
    key_text,
    memory_not_measured,
    position,
    row_key,
    usable,
)

MIN_TRIALS = 3
MAX_TRIALS = 30  # the most trials per tag an inconclusive layout is sent back for
DESIGNS = ("sessions", "interleaved")
ADVICE_NIGHTS = 60  # simulated nights behind an INCONCLUSIVE layout's trials advice

METHOD = (
    "unit: the trial (its median step, warm-up discarded), >= {min} ok, verified trials per "
    "layout and tag; per layout the change d = log ratio of the tags' geometric means "
    "({design}); night = common shift (the level of the layouts most plausibly unchanged, "
    "tested against the session spread) + per-layout deviations (with the layout x "
    "session spread), noise pooled across layouts (empirical-Bayes moderated variances); "
    "REGRESSION / UNEXPECTED IMPROVEMENT when Holm's correction over all {tests} tests "
    "(layouts x time and memory, and the shifts) rejects 'no change' at family-wise "
    "rate {alpha:g} AND the estimate is beyond the threshold; ok when the {level:g}% "
    "interval lies inside +/- threshold; else INCONCLUSIVE")


@dataclass(frozen=True)
class Options:
    baseline: str
    candidate: str
    threshold: float = 0.05
    mem_threshold: float = 0.05
    cluster: Optional[str] = None
    model: Optional[str] = None
    alpha: float = stats.ALPHA  # family-wise error rate over every test (Holm)
    ci: float = stats.LEVEL  # the intervals' coverage
    max_trials: int = MAX_TRIALS  # an inconclusive layout needing more is "about the bound"
    design: str = "sessions"  # sessions | interleaved (pairs the r-th trials of each tag)
    session_spread: Optional[float] = None  # S; None: learned or the profile's (spread.py)
    layout_spread: Optional[float] = None  # L; likewise
    spread: Optional[Spread] = None  # what ``compare`` resolved them to, and from where

    def __post_init__(self) -> None:
        for name in ("threshold", "mem_threshold"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise RegressError(f"{name}={value}: expected a fraction in [0, 1) "
                                   "(0.05 is 5%)")
        if not 0 < self.alpha < 0.5:
            raise RegressError(f"alpha={self.alpha}: expected the family-wise error rate, "
                               "a fraction in (0, 0.5), e.g. alpha=0.05")
        if not 0.5 <= self.ci < 1:
            raise RegressError(f"ci={self.ci}: expected the interval's coverage, a fraction "
                               "in [0.5, 1), e.g. ci=0.95")
        if self.max_trials < MIN_TRIALS:
            raise RegressError(f"max_trials={self.max_trials}: expected an integer >= "
                               f"{MIN_TRIALS} (regress needs {MIN_TRIALS} trials per tag)")
        if self.design not in DESIGNS:
            raise RegressError(f"design={self.design}: expected one of {', '.join(DESIGNS)}")
        for name in ("session_spread", "layout_spread"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0 <= value < 1):
                raise RegressError(f"{name}={value}: expected a relative standard deviation, "
                                   f"a fraction in [0, 1), e.g. {name}=0.01 (1%)")
        if self.baseline == self.candidate:
            raise RegressError(f"baseline={self.baseline} and candidate={self.candidate} are the "
                               "same tag: compare two env tags")


@dataclass(frozen=True)
class LayoutComparison:
    """One key and one layout measured under both tags."""

    key: tuple  # values of COMPARED
    a2a: int
    p2p: int
    comm_type: str
    base_s: tuple[float, ...]  # per-trial medians
    cand_s: tuple[float, ...]
    stored: tuple[int, int] = (0, 0)  # rows of this layout under each tag (repeats count them)
    ratio: Optional[float] = None  # the layout's whole change: ratio of geometric means
    est: Optional[stats.Estimate] = None  # what is judged: the deviation from the shift
    verdict: str = "inconclusive"  # ok | regression | improvement | inconclusive | failing
    base_mem: Optional[list[float]] = None  # per-trial peak memory (device readings only)
    cand_mem: Optional[list[float]] = None
    mem_ratio: Optional[float] = None
    mem_est: Optional[stats.Estimate] = None
    mem_verdict: str = "n/a"  # ok | regression | improvement | inconclusive | n/a
    mem_reason: str = ""  # why n/a
    needed: Optional[int] = None  # inconclusive: trials per tag for 80% power to settle it

    @property
    def layout(self) -> str:
        return f"[{self.a2a},{self.p2p}]"

    @property
    def ci(self) -> tuple[Optional[float], Optional[float]]:
        """The judged ratio's interval (the deviation's, or the whole change's)."""
        return self.est.ratio_interval() if self.est else (None, None)

    @property
    def flagged(self) -> bool:
        """Confirmed: the evidence says it changed (not merely inconclusive)."""
        return (self.verdict not in ("ok", "inconclusive")
                or self.mem_verdict in ("regression", "improvement"))

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive" or self.mem_verdict == "inconclusive"


@dataclass(frozen=True)
class KeyComparison:
    key: tuple
    layouts: tuple[LayoutComparison, ...]
    base_winner: Optional[str]
    cand_winner: Optional[str]
    winner_tie: bool  # the new and old winner are within the candidate's noise

    @property
    def winner_changed(self) -> bool:
        return self.base_winner != self.cand_winner

    @property
    def name(self) -> str:
        return key_text(self.key)


@dataclass
class Comparison:
    options: Options
    keys: list[KeyComparison]
    warnings: list[str] = field(default_factory=list)  # fingerprint drift, injected delays
    shift: Optional[stats.Estimate] = None  # the common shift of step time (None: < 3 layouts)
    mem_shift: Optional[stats.Estimate] = None
    noise: float = 0.0  # the night's typical per-trial relative spread of step time
    tests: int = 0  # the Holm family's size
    alpha: float = stats.ALPHA  # the family-wise rate this look spent (settle: less)
    spread: Optional[Spread] = None  # S and L used (None: interleaved, they cancel)
    shift_from: int = 0  # the layouts the step-time shift was read from (its reference group)

    @property
    def comparisons(self) -> list[LayoutComparison]:
        return [c for k in self.keys for c in k.layouts]

    @property
    def shifts(self) -> list[tuple[str, stats.Estimate]]:
        return [(name, e) for name, e in (("step time", self.shift), ("memory", self.mem_shift))
                if e is not None]

    @property
    def shift_flagged(self) -> list[tuple[str, stats.Estimate]]:
        return [(n, e) for n, e in self.shifts if e.verdict in ("regression", "improvement")]

    @property
    def flagged(self) -> list[LayoutComparison]:
        return [c for c in self.comparisons if c.flagged]

    @property
    def inconclusive(self) -> list[LayoutComparison]:
        return [c for c in self.comparisons if c.inconclusive and not c.flagged]

    @property
    def method(self) -> str:
        o = self.options
        design = ("pairs of interleaved trials" if o.design == "interleaved"
                  else "one session per tag: the shift includes the session effect")
        return METHOD.format(min=MIN_TRIALS, design=design, tests=self.tests,
                             alpha=self.alpha, level=o.ci * 100)

    @property
    def exit_code(self) -> int:
        """1 confirmed, 4 (``EXIT_INCONCLUSIVE``) nothing confirmed but some inconclusive, 0."""
        if self.flagged or self.shift_flagged:
            return EXIT_FINDINGS
        unsure = self.inconclusive or any(e.verdict == "inconclusive" for _, e in self.shifts)
        return EXIT_INCONCLUSIVE if unsure else EXIT_OK


def _median(values: list[float]) -> Optional[float]:
    return percentile(values, 50) if values else None


def _memory(base_ok: list[dict], cand_ok: list[dict]) -> dict[str, Any]:
    """The per-trial device memory of both tags, or ``mem_reason`` (the first reason)."""
    for r in base_ok + cand_ok:
        why = memory_not_measured(r, fingerprint_of(r))
        if why:
            return dict(mem_reason=f"{r.get('env_tag')}: {why}")
    bm = [float(r["peak_mem_bytes"]) for r in base_ok]
    cm = [float(r["peak_mem_bytes"]) for r in cand_ok]
    if not min(bm + cm) > 0:
        return dict(mem_reason="a peak memory of 0 recorded")
    return dict(base_mem=bm, cand_mem=cm, mem_ratio=_median(cm) / _median(bm))


def measured_layout(key: tuple, base_rows: list[dict], cand_rows: list[dict],
                    paired: bool = False) -> LayoutComparison:
    """One layout's numbers (no verdict yet, but ``failing``: no candidate trial ended ok);
    ``paired``: only the pairs of trials at the same position whose both trials count."""
    first = (base_rows or cand_rows)[0]
    base_rows, cand_rows = sorted(base_rows, key=position), sorted(cand_rows, key=position)
    if paired:  # the j-th trial of each tag ran in round j: a failed one drops its pair only
        pairs = [(b, c) for b, c in zip(base_rows, cand_rows) if usable(b) and usable(c)]
        base_ok, cand_ok = [b for b, _ in pairs], [c for _, c in pairs]
    else:
        base_ok, cand_ok = [r for r in base_rows if usable(r)], [r for r in cand_rows if usable(r)]
    b = tuple(float(r["median_s"]) for r in base_ok)
    c = tuple(float(r["median_s"]) for r in cand_ok)
    common = dict(key=key, a2a=int(first["a2a"]), p2p=int(first["p2p"]),
                  comm_type=first.get("comm_type", ""), base_s=b, cand_s=c,
                  stored=(len(base_rows), len(cand_rows)))
    if not c:
        return LayoutComparison(**common, verdict="failing")
    ratio = math.exp(stats.change(b, c)[0])
    return LayoutComparison(**common, ratio=ratio, **_memory(base_ok, cand_ok))


def judge(layouts: list[LayoutComparison], opts: Options,
          alpha: Optional[float] = None) -> tuple[list[LayoutComparison], dict[str, Any]]:
    """Every layout's verdict from one model of the night (time and memory) and Holm's
    correction over all their tests; the Comparison's shift fields."""
    alpha = opts.alpha if alpha is None else alpha
    paired = opts.design == "interleaved"
    timed = [c for c in layouts if c.verdict != "failing"]
    weighed = [c for c in timed if c.base_mem]
    if not timed:
        return layouts, dict(alpha=alpha)
    spread = None if paired else opts.spread
    s, lay = (spread.session, spread.layout) if spread else (0.0, 0.0)
    nights = [stats.night([stats.change(c.base_s, c.cand_s, paired) for c in timed], s, lay)]
    if weighed:
        nights.append(stats.night([stats.change(c.base_mem, c.cand_mem, paired)
                                   for c in weighed]))
    tests = sum(len(n.layouts) + (n.shift is not None) for n in nights)
    nights = stats.judge_all(nights, [opts.threshold, opts.mem_threshold], alpha, opts.ci)
    time_est = dict(zip(map(id, timed), nights[0].layouts))
    mem_est = dict(zip(map(id, weighed), nights[1].layouts)) if weighed else {}
    out = []
    for c in layouts:
        e, m = time_est.get(id(c)), mem_est.get(id(c))
        if e is None:
            out.append(c)
            continue
        fields: dict[str, Any] = dict(est=e, verdict=e.verdict)
        if m is not None:
            fields.update(mem_est=m, mem_verdict=m.verdict)
        if "inconclusive" in (e.verdict, fields.get("mem_verdict")):
            fields["needed"] = _needed(c, e if e.verdict == "inconclusive" else m,
                                       nights[0].s0 if e.verdict == "inconclusive"
                                       else nights[1].s0, opts, tests, len(timed),
                                       nights[0].layout_sd if e.verdict == "inconclusive"
                                       else 0.0)
        out.append(replace(c, **fields))
    extra = dict(shift=nights[0].shift, noise=nights[0].s0, tests=tests, alpha=alpha,
                 spread=spread, shift_from=len(nights[0].reference),
                 mem_shift=nights[1].shift if weighed else None)
    return out, extra


def _needed(c: LayoutComparison, e: stats.Estimate, sd: float, opts: Options, tests: int,
            layouts: int, layout_sd: float = 0.0) -> Optional[int]:
    """Trials per tag that would settle an inconclusive estimate with 80% power at the
    design's family-wise rate: confirm it when its size is beyond the threshold, clear it
    when inside; None beyond max_trials."""
    size = math.expm1(e.est)
    if abs(size) > opts.threshold:  # rounded down to 1% (and the noise up to 0.5%): one
        # simulation serves many layouts, and the advice errs toward more trials
        size = math.copysign(max(math.floor(abs(size) * 100) / 100, opts.threshold + 0.005),
                             size)
        n = stats.trials_for_power(size, math.ceil(sd * 200) / 200, opts.threshold,
                                   opts.alpha, tests, layouts, cap=opts.max_trials,
                                   nights=ADVICE_NIGHTS, layout_sd=layout_sd)
    else:
        n = stats.trials_to_clear(size, sd, opts.threshold, opts.ci, cap=opts.max_trials,
                                  layout_sd=layout_sd)
    have = max(len(c.base_s), len(c.cand_s))
    if n is not None and n <= have:
        n = have + max(2, have // 2)  # the plan says this is enough: the draw was unlucky
    return n if n is not None and n <= opts.max_trials else None


def _winner(groups: dict[int, list[dict]]) -> Optional[tuple[str, float, float]]:
    best = None
    for rows in groups.values():
        vals = [float(r["median_s"]) for r in rows if usable(r)]
        if vals:
            med = _median(vals)
            if best is None or med < best[1]:
                best = (f"[{rows[0]['a2a']},{rows[0]['p2p']}]", med, noise(vals))
    return best


def _by_key_layout(rows: list[dict]) -> dict[tuple, dict[int, list[dict]]]:
    out: dict[tuple, dict[int, list[dict]]] = {}
    for r in rows:
        out.setdefault(row_key(r), {}).setdefault(int(r["a2a"]), []).append(r)
    return out


def _filtered(rows: list[dict], opts: Options) -> list[dict]:
    return [r for r in rows
            if (opts.cluster is None or str(r.get("cluster")) == opts.cluster)
            and (opts.model is None or str(r.get("model")) == opts.model)
            and r.get("status") != "skipped"]


def _pruned(rows: list[dict]) -> int:
    return sum(1 for r in rows if r.get("status") == "pruned")


def compare(rows: list[dict[str, Any]], opts: Options, alpha: Optional[float] = None,
            history: Optional[list[dict[str, Any]]] = None) -> Comparison:
    """Every key and layout measured under both tags; ``RegressError`` for bad input.
    ``alpha``: the family-wise rate this look may spend (``settle``'s looks spend less);
    ``history``: rows of other tags the session spreads may be learned from."""
    rows = _filtered(rows, opts)
    tags = sorted({str(r.get("env_tag")) for r in rows})
    missing = [t for t in (opts.baseline, opts.candidate) if t not in tags]
    if missing:
        parts = [f"{k}={getattr(opts, k)}" for k in ("cluster", "model") if getattr(opts, k)]
        where = f" (with {' '.join(parts)})" if parts else ""
        raise RegressError(
            f"unknown env tag(s) {', '.join(missing)}{where}; tags with stored trials: "
            f"{', '.join(tags) or 'none (run a sweep with env_tag=NAME first)'}")
    base = _by_key_layout([r for r in rows if r.get("env_tag") == opts.baseline])
    cand = _by_key_layout([r for r in rows if r.get("env_tag") == opts.candidate])
    common = sorted(set(base) & set(cand), key=str)
    if not common:
        raise RegressError(f"no common keys: {opts.baseline} has {_keys_text(base)}; "
                           f"{opts.candidate} has {_keys_text(cand)}")
    too_few, per_key, one_sided, pruned = [], [], [], 0
    for key in common:
        layouts = []
        for a2a in sorted(set(base[key]) ^ set(cand[key])):
            only = base[key].get(a2a) or cand[key][a2a]
            one_sided.append(f"{key_text(key)} [{only[0]['a2a']},{only[0]['p2p']}] "
                             f"({only[0].get('env_tag')} only)")
        for a2a in sorted(set(base[key]) & set(cand[key])):
            nb = sum(usable(r) for r in base[key][a2a])
            nc = sum(usable(r) for r in cand[key][a2a])
            if nb == 0:
                continue  # never measured under the baseline: nothing to compare against
            if nb < MIN_TRIALS or 0 < nc < MIN_TRIALS:
                first = base[key][a2a][0]
                pruned += _pruned(base[key][a2a]) + _pruned(cand[key][a2a])
                too_few.append(f"{key_text(key)} [{first['a2a']},{first['p2p']}] "
                               f"({opts.baseline}: {nb}, {opts.candidate}: {nc})")
                continue
            layouts.append(measured_layout(key, base[key][a2a], cand[key][a2a],
                                           opts.design == "interleaved"))
        per_key.append((key, layouts))
    if too_few:
        why = (f"; {pruned} of their trials were pruned (stopped early): a pruned trial is "
               "not a measurement, so a tag swept with early stopping is unusable here"
               if pruned else "")
        raise RegressError(
            f"too few trials: regress needs >= {MIN_TRIALS} ok, verified trials per layout "
            f"under each tag; {'; '.join(too_few)}{why}; measure again with "
            f"search.purpose=regress search.repeats={MIN_TRIALS} (never early-stops) and "
            "the same env_tag")
    chosen = [r for r in rows if r.get("env_tag") in (opts.baseline, opts.candidate)
              and row_key(r) in set(common)]
    if opts.design == "sessions":
        known = {id(r) for r in rows}
        opts = replace(opts, spread=resolve(
            (opts.session_spread, opts.layout_spread),
            rows + [r for r in _filtered(history or [], opts) if id(r) not in known],
            opts.candidate, {str(r.get("cluster")) for r in chosen}))
    judged, extra = judge([c for _, ls in per_key for c in ls], opts, alpha)
    it = iter(judged)
    keys = [_key(key, tuple(next(it) for _ in ls), base[key], cand[key]) for key, ls in per_key]
    report = Comparison(opts, keys, **extra)
    report.warnings = injected_warnings(chosen) + drift_warnings(chosen)
    uncompared = sorted(set(base) ^ set(cand), key=str)
    if uncompared or one_sided:
        report.warnings.append(
            "not compared (measured under one tag only): " + "; ".join(
                [f"{key_text(k)} ({opts.baseline if k in base else opts.candidate} only)"
                 for k in uncompared] + one_sided))
    return report


def _key(key: tuple, layouts: tuple, base: dict, cand: dict) -> KeyComparison:
    bw, cw = _winner(base), _winner(cand)
    tie = False
    if bw and cw and bw[0] != cw[0]:
        old = [float(r["median_s"]) for g in cand.values() for r in g
               if usable(r) and f"[{r['a2a']},{r['p2p']}]" == bw[0]]
        if old:
            tie = _median(old) / cw[1] - 1 <= max(noise(old), cw[2])
    return KeyComparison(key, layouts, bw[0] if bw else None, cw[0] if cw else None, tie)


def _keys_text(groups: dict) -> str:
    return "; ".join(key_text(k) for k in sorted(groups, key=str)) or "no keys"


__all__ = ["COMPARED", "MIN_TRIALS", "MAX_TRIALS", "Options", "LayoutComparison",
           "KeyComparison", "Comparison", "RegressError", "compare", "key_text", "row_key"]
