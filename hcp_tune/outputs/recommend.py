"""``recommend``: the best measured layout for a key, as paste-ready Bridge settings.

Reads ``recommendations.csv`` only; never measures. When nothing was measured for the key
it says so and lists the nearest keys that were.
"""
from __future__ import annotations

import math
import shlex
from typing import Any, Optional

from hcp_tune.config.settings import REPEATS_MAX as MAX_REPEATS
from hcp_tune.engine.error_rates import rate_for
from hcp_tune.store.records import key_args, key_field
from hcp_tune.stats.verdict import MIN_TRIALS
from hcp_tune.space.layout import Layout


def matches(rec: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(str(key_field(rec, k)) == str(v) for k, v in want.items() if v is not None)


def find(recs: list[dict[str, Any]], want: dict[str, Any]) -> list[dict[str, Any]]:
    """Recommendations for the key, most-measured first."""
    return sorted((r for r in recs if matches(r, want)), key=lambda r: -int(r["trials"]))


def nearest(recs: list[dict[str, Any]], want: dict[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """Measured keys closest to ``want``: same cluster and model first, then by how far
    cp, tp and seq are (in powers of two)."""
    def distance(r: dict[str, Any]) -> float:
        d = 0.0
        for k, weight in (("cluster", 100), ("model", 50)):
            d += weight * (str(r[k]) != str(want[k]))
        for k in ("cp", "tp", "pp", "seq"):
            if want.get(k):
                d += abs(math.log2(float(key_field(r, k) or 1) / float(want[k])))
        return d

    return sorted(recs, key=distance)[:n]


def bridge_overrides(rec: dict[str, Any]) -> list[str]:
    return Layout(int(rec["a2a"]), int(rec["p2p"])).bridge_overrides()


def python_form(rec: dict[str, Any]) -> list[str]:
    layout = Layout(int(rec["a2a"]), int(rec["p2p"]))
    lines = [f"cfg.model.context_parallel_size = {layout.cp}"]
    if layout.comm_type != "none":
        lines.append(f'cfg.model.cp_comm_type = "{layout.comm_type}"')
        sizes = layout.sizes if layout.comm_type == "a2a+p2p" else None
        lines.append(f"cfg.model.hierarchical_context_parallel_sizes = {sizes}")
    return lines


def key_text(r: dict[str, Any]) -> str:
    return (f"cluster={r['cluster']} model={r['model']} tp={r['tp']} pp={r.get('pp', 1)} "
            f"cp={r['cp']} seq={r['seq']}"
            + (f" mix={key_field(r, 'mix')}" if key_field(r, "mix") else "")
            + f" env_tag={r.get('env_tag', '')}")


def answer(recs: list[dict[str, Any]], want: dict[str, Any]) -> tuple[Optional[dict], list[dict]]:
    """(the recommendation or None, the nearest measured keys when there is none)."""
    found = find(recs, want)
    if found:
        return found[0], []
    return None, nearest(recs, want)


def unfit_reason(rec: dict[str, Any], predicted: list[dict[str, Any]],
                 gpu_memory_gib: float) -> Optional[str]:
    """Why a measured best layout must not be recommended (it would run out of memory in
    training), or None. Measured: its peak (reserved or device-used) memory over the GPU's;
    predicted: the cost model's full-step memory of that layout over it."""
    peak = rec.get("peak_mem_bytes")
    if peak is not None and not (isinstance(peak, float) and math.isnan(peak)) \
            and float(peak) > gpu_memory_gib * 1024**3:
        return (f"[{rec['a2a']},{rec['p2p']}] measured {float(peak) / 1024**3:.1f} GiB peak "
                f"> {gpu_memory_gib:g} GiB per GPU")
    for r in predicted:
        if (r["a2a"], r["p2p"]) == (int(rec["a2a"]), int(rec["p2p"])) and not r["fits_memory"]:
            return (f"[{rec['a2a']},{rec['p2p']}] is predicted to need "
                    f"{r['predicted_memory_gib']:.1f} GiB per GPU in training > "
                    f"{gpu_memory_gib:g} GiB")
    return None


def _num(v: Any) -> Optional[float]:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def figure_text(rec: dict[str, Any]) -> str:
    """The best layout's figure, its 95% interval and the trials behind it: "median
    0.4857 s (95% CI 0.47-0.52 s) over 5 ok trial(s)"; a table of schema 1 has no
    interval and says so."""
    med, lo, hi = _num(rec.get("median_s")), _num(rec.get("ci_lo_s")), _num(rec.get("ci_hi_s"))
    n = int(_num(rec.get("n_trials")) or 0)
    if not n:  # written before issue 28: the fastest trial, no interval
        return f"median {med:.4g} s (an older table: no interval; run the sweep again)"
    ci = f" (95% CI {lo:.4g}-{hi:.4g} s)" if lo is not None and hi is not None else \
        " (no interval: one trial)"
    return f"median {med:.4g} s{ci} over {n} ok trial(s) of this layout"


def measure_command(rec: dict[str, Any], results_dir: Optional[str] = None) -> str:
    """The sweep that takes only the undecided layouts of an unsettled key to the trials the
    power calculation asks for (``verdict.trials_to_decide``), in one go (adaptive off: the
    stored trials count), at most ``MAX_REPEATS`` a layout; ``results_dir``: the folder the
    key was read from, when it is not the default."""
    a2a = [int(x.strip("[]").split(",")[0]) for x in str(rec.get("undecided") or "").split()]
    args = key_args(rec)
    if str(rec.get("env_tag") or "default") != "default":
        args.append(f"env_tag={rec['env_tag']}")
    if results_dir:
        args.append(f"results_dir={results_dir}")
    args += [f"search.a2a_sizes=[{','.join(map(str, a2a))}]", "search.adaptive=false",
             f"search.repeats={min(wanted_trials(rec), MAX_REPEATS)}"]
    return "python -m hcp_tune sweep " + " ".join(shlex.quote(a) for a in args)


def wanted_trials(rec: dict[str, Any]) -> int:
    """The trials a layout of an unsettled key should have in all (the best's and the
    power calculation's more; at least an interval's worth)."""
    total = int(_num(rec.get("n_trials")) or 0) + int(_num(rec.get("more_trials")) or 0)
    return max(total, MIN_TRIALS + 1)


def runner_label(rec: dict[str, Any]) -> str:
    """runner=synthetic's keys say what they are wherever a key is shown: nothing was
    measured, the trials were drawn from a truth file (hcp_tune/engine/synthetic.py)."""
    if rec.get("runner") != "synthetic":
        return ""
    return " runner=synthetic (drawn from a truth file, not measured)"


def verdict_lines(rec: dict[str, Any], results_dir: Optional[str] = None) -> list[str]:
    """The key's verdict in words (docs/guides/ranking.md), with its measured error rate."""
    kind = rec.get("verdict") or ""
    best = f"[{rec['a2a']},{rec['p2p']}]"
    level = _num(rec.get("level"))
    conf = f"{level:.1%} confidence, this look's share of the sweep's 5%" if level else \
        "95% confidence"
    if kind == "settled":
        early = rec.get("stopped_early")
        out = f"settled: {best} is the fastest"
        if rec.get("runner_up"):
            out += f"; every other measured layout is slower ({conf})"
        if early:
            out += (f"; {early} stopped early (every step >= 10% slower than the best): outside "
                    "that claim")
        return [f"{out}; for this sweep's session ({rate_for(kind)})"]
    if kind == "tie":
        return [f"tie: {rec.get('tied')} are equivalent within the tie threshold (the "
                f"interval of their ratio inside 1 +- threshold, {conf}); {rec.get('lighter')} "
                f"uses the least memory; for this sweep's session ({rate_for(kind)})"]
    if kind == "unsettled" and not rec.get("undecided"):
        return [f"unsettled: only {best} has a usable measurement, so nothing was compared "
                "(the other layouts failed, were skipped, or were left out by "
                "search.a2a_sizes); more trials of it would not change that"]
    if kind == "unsettled":
        more = int(_num(rec.get("more_trials")) or 0)
        over = (f"; that is more than one sweep measures (search.repeats <= {MAX_REPEATS}): "
                f"at this noise they are practically equal, and the command takes them to "
                f"{MAX_REPEATS} trials each" if wanted_trials(rec) > MAX_REPEATS else "")
        return [f"unsettled: {rec.get('undecided')} are not yet separated; about {more} more "
                f"trial(s) each should settle it (80% power; {rate_for(kind)}){over}; measure "
                "only them with:", "  " + measure_command(rec, results_dir)]
    return []


def sweep_verdict_lines(recs: list[dict[str, Any]], results_dir: str) -> list[str]:
    """Under the sweep's table: each verdict's measured error rate once, and per unsettled
    key its undecided layouts with the command that measures only them."""
    kinds = {r.get("verdict") for r in recs}
    out = [f"{k}: {rate_for(k)}" for k in ("settled", "tie") if k in kinds]
    early = [r for r in recs if r.get("verdict") == "settled" and r.get("stopped_early")]
    if early:
        out.append(f"settled in {len(early)} key(s) with layouts stopped early (every step "
                   ">= 10% slower than the best): those are outside the 95% claim "
                   "(`recommend` of a key names them)")
    for r in recs:
        if r.get("verdict") == "unsettled":
            first, *rest = verdict_lines(r, results_dir)
            out += [f"tp={r['tp']} seq={r['seq']}: {first}", *rest]
    return out
