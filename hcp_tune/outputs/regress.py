"""``regress``: compare what two environment tags measured, key by key and layout by layout.

Reads stored rows only (``ResultStore(results_dir).rows()``); never measures, never imports
torch or pandas. Everything here is a pure function of those rows, so the verdict logic is
tested on recorded rows.

The statistics (stated in every report, ``METHOD``):

- **The unit is the trial.** A trial's statistic is its ``median_s``: the median of its
  measured steps, warm-up steps discarded (``runner.warmup_steps``, default 2; see
  ``hcp_tune/job/bench.py``). Steps within one trial share an allocation and are
  correlated, so they are never pooled as samples; only per-trial medians are.
- Only trials that ended ``ok`` and proved CP active (``verified``) count. A layout needs
  ``MIN_TRIALS`` (3) of them under each tag, else ``regress`` refuses (exit 2) and names
  them: run the sweep again with ``search.repeats=3`` (and ``search.early_stop=false``,
  since a pruned trial is not a measurement).
- **Ratio** = median of the candidate's per-trial medians / median of the baseline's.
  **Interval** (95% by default, ``ci=``): percentile bootstrap, ``BOOTSTRAP_N`` resamples
  of each tag's per-trial medians with replacement (independently per tag), the ratio of
  medians of each resample; ``random.Random(seed)``, seed 0 by default, so a report is
  reproducible.
- **Noise floor** of a layout = the larger of the two tags' noise over their per-trial
  medians (``hcp_tune.noise.noise``: half the p10-p90 band relative to the median; the
  allocation-to-allocation variation). **Bound** (the tolerance) = max(threshold, noise
  floor); ``noise_floor=false`` makes it the threshold alone.
- **Verdict from the interval** (``regress_verdict.verdict``): ``regression`` when the
  whole interval lies above 1 + bound; ``improvement`` (unexpected, flagged like a
  regression, as Megatron-Bridge's performance CI does: a sudden speed-up can be CP
  silently off) when it lies below 1 - bound; ``ok`` when it lies inside [1 - bound,
  1 + bound]; a regression or improvement on fewer than ``CONFIRM_TRIALS`` (5) trials per
  tag is not confirmed (inconclusive, 5 trials to settle it: on the shared CPU the A/A
  false-alarm rate across sessions was 14.5% with 3 trials, at most 4.5% with 5);
  ``inconclusive`` when the interval straddles an edge, with the trials per tag that
  would likely settle it (``regress_verdict.trials_to_settle``) and the sweep command
  that adds them; ``failing`` when the baseline measured the layout and the candidate has
  trials of it but none ended ok.
- **Memory**: judged only where both tags' rows hold a per-trial device measurement
  (``regress_verdict.memory_not_measured``: the CUDA allocator or the device's used
  memory, read from the row's ``mem_note``, or for an older row its fingerprint's GPU):
  the ratio of per-trial ``peak_mem_bytes`` medians against ``mem_threshold`` and the
  memory noise floor. Elsewhere ``n/a``, with the reason.
- **Winner** of a key under a tag: the layout with the lowest median of per-trial medians;
  a changed winner is reported (with whether the two are within the candidate's noise),
  and does not by itself change the exit code.
- **Exit code**: 1 when anything is confirmed (a regression, an unexpected improvement, a
  failing layout, a memory regression); else ``EXIT_INCONCLUSIVE`` (4) when a layout is
  inconclusive; else 0. Bad input: 2.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hcp_tune.engine.records import OLDER_ROW_DEFAULTS, key_field
from hcp_tune.errors import EXIT_FINDINGS, EXIT_INCONCLUSIVE, EXIT_OK, HcpError
from hcp_tune.noise import noise, percentile
from hcp_tune.outputs.regress_verdict import (  # bootstrap_ratio_ci: also its old home
    BOOTSTRAP_N,
    CI_LEVEL,
    bootstrap_ratio_ci,
    memory_not_measured,
    trials_to_settle,
    verdict,
)

MIN_TRIALS = 3
CONFIRM_TRIALS = 5  # a confirmed verdict needs this many per tag (the A/A false-alarm rate
# across sessions on the shared CPU was 14.5% with 3, <= 4.5% with 5: docs/regress.md)
MAX_TRIALS = 30  # the most trials per tag an inconclusive layout is sent back for
# the sweep key without env_tag
COMPARED = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "dp", "mbs", "micro_batches")
IGNORED_FINGERPRINT = ("hosts",)  # host names alone never make rows differ

METHOD = (
    "unit: the trial (its median step over the measured steps, warm-up discarded); "
    f"needs >= {MIN_TRIALS} ok, verified trials per layout under each tag; ratio = median of "
    "the candidate's per-trial medians / the baseline's; interval: percentile bootstrap "
    f"over per-trial medians ({BOOTSTRAP_N} resamples per tag, seeded); noise floor: the larger "
    "tag's p10-p90 half-width of per-trial medians (hcp_tune.noise); bound = max(threshold, "
    "noise floor); REGRESSION / UNEXPECTED IMPROVEMENT only when the whole interval lies "
    f"beyond 1 +/- bound on >= {CONFIRM_TRIALS} trials per tag, ok when it lies inside, "
    "INCONCLUSIVE when it straddles an edge (or lies beyond on fewer trials); "
    "memory judged only on per-trial device readings")


class RegressError(HcpError):
    """Bad input to ``regress`` (exit 2): unknown tag, no common keys, too few trials."""


@dataclass(frozen=True)
class Options:
    baseline: str
    candidate: str
    threshold: float = 0.05
    mem_threshold: float = 0.05
    cluster: Optional[str] = None
    model: Optional[str] = None
    seed: int = 0
    ci: float = CI_LEVEL  # the interval's coverage
    noise_floor: bool = True  # the bound is max(threshold, noise floor); False: threshold
    max_trials: int = MAX_TRIALS  # an inconclusive layout needing more is "about the bound"
    confirm_trials: int = CONFIRM_TRIALS  # trials per tag a REGRESSION/IMPROVEMENT needs

    def __post_init__(self) -> None:
        for name in ("threshold", "mem_threshold"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise RegressError(f"{name}={value}: expected a fraction >= 0 (0.05 is 5%)")
        if not 0.5 <= self.ci < 1:
            raise RegressError(f"ci={self.ci}: expected the interval's coverage, a fraction "
                               "in [0.5, 1), e.g. ci=0.95")
        if not MIN_TRIALS <= self.confirm_trials <= self.max_trials:
            raise RegressError(f"confirm_trials={self.confirm_trials}: expected an integer "
                               f"from {MIN_TRIALS} to max_trials ({self.max_trials})")
        if self.max_trials < MIN_TRIALS:
            raise RegressError(f"max_trials={self.max_trials}: expected an integer >= "
                               f"{MIN_TRIALS} (regress needs {MIN_TRIALS} trials per tag)")
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
    ratio: Optional[float]
    ci: tuple[Optional[float], Optional[float]]
    noise_floor: float
    bound: float
    verdict: str  # ok | regression | improvement | inconclusive | failing
    base_mem: Optional[float] = None
    cand_mem: Optional[float] = None
    mem_ratio: Optional[float] = None
    mem_verdict: str = "n/a"  # ok | regression | n/a
    mem_reason: str = ""  # why n/a
    needed: Optional[int] = None  # inconclusive: trials per tag that would likely settle it
    stored: tuple[int, int] = (0, 0)  # rows of this layout under each tag (a sweep's repeats count them)

    @property
    def layout(self) -> str:
        return f"[{self.a2a},{self.p2p}]"

    @property
    def flagged(self) -> bool:
        """Confirmed: the evidence says it changed (not merely inconclusive)."""
        return self.verdict not in ("ok", "inconclusive") or self.mem_verdict == "regression"

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "inconclusive"


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

    @property
    def comparisons(self) -> list[LayoutComparison]:
        return [c for k in self.keys for c in k.layouts]

    @property
    def flagged(self) -> list[LayoutComparison]:
        return [c for c in self.comparisons if c.flagged]

    @property
    def inconclusive(self) -> list[LayoutComparison]:
        return [c for c in self.comparisons if c.inconclusive and not c.flagged]

    @property
    def exit_code(self) -> int:
        """1 confirmed, 4 (``EXIT_INCONCLUSIVE``) nothing confirmed but some inconclusive, 0."""
        if self.flagged:
            return EXIT_FINDINGS
        return EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK


def key_text(key: tuple) -> str:
    """The key as the user types it; pp=1 is left out, as in the sweep key's name."""
    return " ".join(f"{k}={v}" for k, v in zip(COMPARED, key) if v != OLDER_ROW_DEFAULTS.get(k))


def row_key(r: dict[str, Any]) -> tuple:
    """A row's COMPARED values; a row stored before pp joined the key has pp=1."""
    return tuple(key_field(r, k) for k in COMPARED)


def fingerprint_of(row: dict[str, Any]) -> dict[str, Any]:
    fp = row.get("fingerprint") or {}
    if isinstance(fp, str):
        try:
            fp = json.loads(fp)
        except json.JSONDecodeError:
            fp = {}
    return fp if isinstance(fp, dict) else {}


def usable(row: dict[str, Any]) -> bool:
    m = row.get("median_s")
    return (row.get("status") == "ok" and bool(row.get("verified"))
            and isinstance(m, (int, float)) and not math.isnan(m) and m > 0)


def _median(values: list[float]) -> Optional[float]:
    return percentile(values, 50) if values else None


def _memory(base_ok: list[dict], cand_ok: list[dict], opts: Options) -> dict[str, Any]:
    """The memory fields of a comparison: a verdict only when every usable row of both
    tags holds a per-trial device reading, else ``n/a`` and the first reason."""
    for r in base_ok + cand_ok:
        why = memory_not_measured(r, fingerprint_of(r))
        if why:
            return dict(mem_reason=f"{r.get('env_tag')}: {why}")
    bm = [float(r["peak_mem_bytes"]) for r in base_ok]
    cm = [float(r["peak_mem_bytes"]) for r in cand_ok]
    mem: dict[str, Any] = dict(base_mem=_median(bm), cand_mem=_median(cm))
    if not _median(bm) > 0:
        return dict(mem, mem_reason=f"{opts.baseline}: peak memory 0")
    mem_ratio = _median(cm) / _median(bm)
    mem_bound = max(opts.mem_threshold, noise(bm), noise(cm))
    return dict(mem, mem_ratio=mem_ratio,
                mem_verdict="regression" if mem_ratio - 1 > mem_bound else "ok")


def compare_layout(key: tuple, base_rows: list[dict], cand_rows: list[dict],
                   opts: Options) -> LayoutComparison:
    """The verdict for one layout of one key (both row lists already filtered to it)."""
    first = (base_rows or cand_rows)[0]
    base_ok, cand_ok = [r for r in base_rows if usable(r)], [r for r in cand_rows if usable(r)]
    b = [float(r["median_s"]) for r in base_ok]
    c = [float(r["median_s"]) for r in cand_ok]
    common = dict(key=key, a2a=int(first["a2a"]), p2p=int(first["p2p"]),
                  comm_type=first.get("comm_type", ""), base_s=tuple(b), cand_s=tuple(c))
    common["stored"] = (len(base_rows), len(cand_rows))
    if not c:  # the baseline measured it (checked by the caller); the candidate fails it
        return LayoutComparison(**common, ratio=None, ci=(None, None), noise_floor=0.0,
                                bound=opts.threshold, verdict="failing")
    ratio = _median(c) / _median(b)
    seed = opts.seed + hash_key(key, common["a2a"])  # one stream per layout: stable order
    ci = bootstrap_ratio_ci(b, c, seed=seed, level=opts.ci)
    floor = max(noise(b), noise(c))
    bound = max(opts.threshold, floor) if opts.noise_floor else opts.threshold
    said = verdict(ci[0], ci[1], bound)
    needed = None
    if said in ("regression", "improvement") and min(len(b), len(c)) < opts.confirm_trials:
        said, needed = "inconclusive", opts.confirm_trials  # beyond, but on too few trials
    elif said == "inconclusive":
        needed = trials_to_settle(b, c, ratio, bound, level=opts.ci, cap=opts.max_trials)
    return LayoutComparison(**common, ratio=ratio, ci=ci, noise_floor=floor, bound=bound,
                            verdict=said, needed=needed, **_memory(base_ok, cand_ok, opts))


def hash_key(key: tuple, a2a: int) -> int:
    """A deterministic per-layout offset of the seed (Python's ``hash`` is salted)."""
    return sum((i + 1) * ord(ch) for i, ch in enumerate(f"{key_text(key)}|{a2a}")) % 100003


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
        key = row_key(r)
        out.setdefault(key, {}).setdefault(int(r["a2a"]), []).append(r)
    return out


def _filtered(rows: list[dict], opts: Options) -> list[dict]:
    return [r for r in rows
            if (opts.cluster is None or str(r.get("cluster")) == opts.cluster)
            and (opts.model is None or str(r.get("model")) == opts.model)
            and r.get("status") != "skipped"]


def compare(rows: list[dict[str, Any]], opts: Options) -> Comparison:
    """Every key and layout measured under both tags; ``RegressError`` for bad input."""
    rows = _filtered(rows, opts)
    tags = sorted({str(r.get("env_tag")) for r in rows})
    missing = [t for t in (opts.baseline, opts.candidate) if t not in tags]
    if missing:
        where = _filter_text(opts)
        raise RegressError(
            f"unknown env tag(s) {', '.join(missing)}{where}; tags with stored trials: "
            f"{', '.join(tags) or 'none (run a sweep with env_tag=NAME first)'}")
    base = _by_key_layout([r for r in rows if r.get("env_tag") == opts.baseline])
    cand = _by_key_layout([r for r in rows if r.get("env_tag") == opts.candidate])
    common = sorted(set(base) & set(cand), key=str)
    if not common:
        raise RegressError(
            f"no common keys: {opts.baseline} has {_keys_text(base)}; "
            f"{opts.candidate} has {_keys_text(cand)}")
    too_few, keys, one_sided = [], [], []
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
                too_few.append(f"{key_text(key)} [{first['a2a']},{first['p2p']}] "
                               f"({opts.baseline}: {nb}, {opts.candidate}: {nc})")
                continue
            layouts.append(compare_layout(key, base[key][a2a], cand[key][a2a], opts))
        bw, cw = _winner(base[key]), _winner(cand[key])
        tie = False
        if bw and cw and bw[0] != cw[0]:
            old = [float(r["median_s"]) for g in cand[key].values() for r in g
                   if usable(r) and f"[{r['a2a']},{r['p2p']}]" == bw[0]]
            if old:
                margin = _median(old) / cw[1] - 1
                tie = margin <= max(noise(old), cw[2])
        keys.append(KeyComparison(key, tuple(layouts), bw[0] if bw else None,
                                  cw[0] if cw else None, tie))
    if too_few:
        raise RegressError(
            f"too few trials: regress needs >= {MIN_TRIALS} ok, verified trials per layout "
            f"under each tag; {'; '.join(too_few)}; measure again with search.repeats="
            f"{MIN_TRIALS} search.early_stop=false and the same env_tag")
    report = Comparison(opts, keys)
    chosen = [r for r in rows if r.get("env_tag") in (opts.baseline, opts.candidate)
              and row_key(r) in set(common)]
    report.warnings = injected_warnings(chosen) + drift_warnings(chosen)
    uncompared = sorted(set(base) ^ set(cand), key=str)
    if uncompared or one_sided:
        report.warnings.append(
            "not compared (measured under one tag only): " + "; ".join(
                [f"{key_text(k)} ({opts.baseline if k in base else opts.candidate} only)"
                 for k in uncompared] + one_sided))
    return report


def _filter_text(opts: Options) -> str:
    parts = [f"{k}={getattr(opts, k)}" for k in ("cluster", "model") if getattr(opts, k)]
    return f" (with {' '.join(parts)})" if parts else ""


def _keys_text(groups: dict) -> str:
    return "; ".join(key_text(k) for k in sorted(groups, key=str)) or "no keys"


def injected_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per tag whose rows carry an injected delay (HCP_TUNE_INJECT_DELAY)."""
    found: dict[str, dict[str, int]] = {}
    for r in rows:
        delay = fingerprint_of(r).get("inject_delay")
        if delay:
            tag = found.setdefault(str(r.get("env_tag")), {})
            tag[delay] = tag.get(delay, 0) + 1
    return [f"{tag}: {sum(d.values())} trial(s) ran with an injected delay "
            f"(HCP_TUNE_INJECT_DELAY={', '.join(sorted(d))}): a testing aid, not a real "
            "measurement" for tag, d in sorted(found.items())]


def _flat(fp: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in fp.items():
        if k in IGNORED_FINGERPRINT or v is None:
            continue  # None and absent (a row from an older job) both read "unset"
        if isinstance(v, dict):
            for sk, sv in v.items():
                out[f"{k}.{sk}"] = str(sv)
        else:
            out[k] = str(v)
    return out


def drift_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per tag whose rows' versions or settings differ (host names excluded)."""
    lines = []
    for tag in sorted({str(r.get("env_tag")) for r in rows}):
        flats = [_flat(fingerprint_of(r)) for r in rows if str(r.get("env_tag")) == tag
                 and fingerprint_of(r)]
        names = sorted({k for f in flats for k in f})
        diffs = []
        for name in names:
            counts: dict[str, int] = {}
            for f in flats:
                value = f.get(name, "unset")
                counts[value] = counts.get(value, 0) + 1
            if len(counts) > 1:
                diffs.append(f"{name} (" + ", ".join(f"{v} x{n}" for v, n in sorted(counts.items()))
                             + ")")
        if diffs:
            lines.append(f"{tag}: rows under this tag differ in {'; '.join(diffs)}: they are "
                         "pooled as one stack; give each stack its own env_tag")
    return lines
