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
  **95% interval**: percentile bootstrap, ``BOOTSTRAP_N`` resamples of each tag's
  per-trial medians with replacement (independently per tag), the ratio of medians of
  each resample, its 2.5th and 97.5th percentiles; ``random.Random(seed)``, seed 0 by
  default, so a report is reproducible.
- **Noise floor** of a layout = the larger of the two tags' noise over their per-trial
  medians (``hcp_tune.noise.noise``: half the p10-p90 band relative to the median; the
  allocation-to-allocation variation). **Bound** = max(threshold, noise floor).
- **Verdict**: ``regression`` when ratio - 1 > bound; ``improvement`` (unexpected, flagged
  like a regression, as Megatron-Bridge's performance CI does: a sudden speed-up can be CP
  silently off) when 1 - ratio > bound; ``failing`` when the baseline measured the layout
  and the candidate has trials of it but none ended ok; ``ok`` otherwise.
- **Memory**: the same ratio of per-trial ``peak_mem_bytes`` medians against
  ``mem_threshold`` and the memory noise floor; not compared when the baseline's is 0 or
  unknown (the CPU's peak-RSS growth is often 0).
- **Winner** of a key under a tag: the layout with the lowest median of per-trial medians;
  a changed winner is reported (with whether the two are within the candidate's noise),
  and does not by itself change the exit code.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from hcp_tune.engine.records import OLDER_ROW_DEFAULTS, key_field
from hcp_tune.errors import HcpError
from hcp_tune.noise import noise, percentile

MIN_TRIALS = 3
BOOTSTRAP_N = 2000
CI_LEVEL = 0.95
# the sweep key without env_tag
COMPARED = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "dp", "mbs", "micro_batches")
IGNORED_FINGERPRINT = ("hosts",)  # host names alone never make rows differ

METHOD = (
    "unit: the trial (its median step over the measured steps, warm-up discarded); "
    f"needs >= {MIN_TRIALS} ok, verified trials per layout under each tag; ratio = median of "
    "the candidate's per-trial medians / the baseline's; 95% interval: percentile bootstrap "
    f"over per-trial medians ({BOOTSTRAP_N} resamples per tag, seeded); noise floor: the larger "
    "tag's p10-p90 half-width of per-trial medians (hcp_tune.noise); flagged when |ratio - 1| "
    "> max(threshold, noise floor)")


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

    def __post_init__(self) -> None:
        for name in ("threshold", "mem_threshold"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise RegressError(f"{name}={value}: expected a fraction >= 0 (0.05 is 5%)")
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
    verdict: str  # ok | regression | improvement | failing
    base_mem: Optional[float] = None
    cand_mem: Optional[float] = None
    mem_ratio: Optional[float] = None
    mem_verdict: str = "n/a"  # ok | regression | n/a

    @property
    def layout(self) -> str:
        return f"[{self.a2a},{self.p2p}]"

    @property
    def flagged(self) -> bool:
        return self.verdict != "ok" or self.mem_verdict == "regression"


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
    def exit_code(self) -> int:
        return 1 if self.flagged else 0


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


def bootstrap_ratio_ci(base: list[float], cand: list[float], *, seed: int,
                       n: int = BOOTSTRAP_N, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(cand)/median(base), resampling each tag's
    per-trial medians with replacement, independently."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        b = [base[rng.randrange(len(base))] for _ in base]
        c = [cand[rng.randrange(len(cand))] for _ in cand]
        ratios.append(percentile(c, 50) / percentile(b, 50))
    tail = (1 - level) / 2 * 100
    return percentile(ratios, tail), percentile(ratios, 100 - tail)


def _median(values: list[float]) -> Optional[float]:
    return percentile(values, 50) if values else None


def _mem_values(rows: list[dict[str, Any]]) -> list[float]:
    out = []
    for r in rows:
        v = r.get("peak_mem_bytes")
        if isinstance(v, (int, float)) and not math.isnan(v):
            out.append(float(v))
    return out


def compare_layout(key: tuple, base_rows: list[dict], cand_rows: list[dict],
                   opts: Options) -> LayoutComparison:
    """The verdict for one layout of one key (both row lists already filtered to it)."""
    first = (base_rows or cand_rows)[0]
    base_ok, cand_ok = [r for r in base_rows if usable(r)], [r for r in cand_rows if usable(r)]
    b = [float(r["median_s"]) for r in base_ok]
    c = [float(r["median_s"]) for r in cand_ok]
    common = dict(key=key, a2a=int(first["a2a"]), p2p=int(first["p2p"]),
                  comm_type=first.get("comm_type", ""), base_s=tuple(b), cand_s=tuple(c))
    if not c:  # the baseline measured it (checked by the caller); the candidate fails it
        return LayoutComparison(**common, ratio=None, ci=(None, None), noise_floor=0.0,
                                bound=opts.threshold, verdict="failing")
    ratio = _median(c) / _median(b)
    seed = opts.seed + hash_key(key, common["a2a"])  # one stream per layout: stable order
    ci = bootstrap_ratio_ci(b, c, seed=seed)
    floor = max(noise(b), noise(c))
    bound = max(opts.threshold, floor)
    verdict = ("regression" if ratio - 1 > bound else
               "improvement" if 1 - ratio > bound else "ok")
    bm, cm = _mem_values(base_ok), _mem_values(cand_ok)
    mem = dict(base_mem=_median(bm), cand_mem=_median(cm))
    if bm and cm and _median(bm) > 0:
        mem_ratio = _median(cm) / _median(bm)
        mem_bound = max(opts.mem_threshold, noise(bm), noise(cm))
        mem.update(mem_ratio=mem_ratio,
                   mem_verdict="regression" if mem_ratio - 1 > mem_bound else "ok")
    return LayoutComparison(**common, ratio=ratio, ci=ci, noise_floor=floor, bound=bound,
                            verdict=verdict, **mem)


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
