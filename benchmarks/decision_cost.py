"""What adaptive measuring (``search.adaptive``, the default) costs and how often it picks
what the exhaustive sweep picks: issue 28's decision-cost benchmark.

Each key is replayed many times through the sweep's real decision code, once per policy,
on the same draws (trial ``i`` of a layout is the same draw in both policies), **as users
run a sweep: one session, every layout of the key measured in it**:

- **exhaustive**: ``search.adaptive=false search.repeats=5`` (early stopping on, the
  default: a trial of another layout clearly slower than the best is pruned; the best
  layout's own trials never are);
- **adaptive**: ``search.min_repeats`` trials a layout, up to ``search.repeats=5``: the
  plan's rounds, a pruned layout's queued repeats dropped, then ``sweep_adaptive.next_round``
  until the key is settled, a tie, or at the cap.

The decisions are the engine's own functions: ``verdict.decide`` (the verdict),
``verdict.figures`` (the early-stop reference), ``trials.should_prune`` (early stopping,
on a trial's first 3 steps), ``sweep_adaptive.next_round`` / ``closed``. Trials run one at
a time in the replay (the real sweep runs a batch at once; the decisions are the same).

**Tuning and held-out keys.** Every other key of each table (sorted order) is a tuning
key: ``search.min_repeats``'s default is the smallest value whose tuning figures meet the
accuracy goals (``--tune-only`` prints that part alone). The other table keys and every
recording are held out: they report the shipped default (read from
conf/search/default.yaml), whose code and default were committed before (the commit is
printed), and ``recommend`` states their figures.

Keys (their per-layout trial distributions):

- **CPU pools** (``regress_pool_rows.jsonl``): recorded trials of ``cluster=local
  model=tiny cp=2 seq=1024``, 8 a layout per session: the clean sessions pool-1..4,
  delay-1..2 (the ring layout slowed) and bigdelay-1 (several-fold, one session).
- **This issue's recording** (``decision_cost_rows.jsonl``): ``cluster=local model=tiny
  cp=4 seq=2048``, 5 trials a layout on the loaded shared machine (one session).
- **The H200 recording** (``recordings/h200-attention-compute.jsonl``,
  ``gpu_recording.py``): real GPU noise, one CP rank's attention compute for the 4 splits
  of cp=8 at seq 32768 and 131072 (no communication), 8 trials a layout in each of 6
  sessions on two machines. The splits differ by 1.5-4.7% at 128K: near ties, on the
  noise a GPU really has.

  A recording's replay ``i`` resamples the trials of one session (in turn); its truth is
  the median of the other sessions' trials (the same session's when it is the only one).
- **Published tables** (``published/yunchang-*.jsonl``: 8x A100; ``cpu_splits_rows`` and
  ``calibrate_cpu_rows``: this machine's CPU layouts) with a stated noise model: a trial's
  median is the table's value times exp(N(0, s)), s = 1%, 2%, 3% (the spread of trial
  medians between allocations), its steps the trial median times exp(N(0, 1%)).

Measured per group: trials and GPU-hours (a trial costs its GPUs x (30 s start-up +
(2 warm-up + 5 measured steps) x step); a pruned one 2 + 3 steps) of adaptive over
exhaustive; how often adaptive's winner is the exhaustive one or a declared tie holds it;
how often a "settled" verdict named a layout that is not the truth's fastest, and a
declared tie was wrong (95% Wilson intervals). Goal (issue 28): <= 40% of the exhaustive
cost, the same winner or a correct tie in >= 95% of keys, a wrong "settled" <= 5%.

    PYTHONPATH=$PWD python benchmarks/decision_cost.py [--replays 40] [--tune-only]
        [--out benchmarks/RESULTS-decision-cost.md]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hcp_tune.engine import sweep_adaptive, verdict  # noqa: E402
from hcp_tune.engine.trials import MIN_STEPS_TO_PRUNE, should_prune  # noqa: E402
from hcp_tune.noise import percentile  # noqa: E402
from rates import rate  # noqa: E402
from stamp import write_results  # noqa: E402

B = REPO / "benchmarks"
REPEATS, THRESHOLD = 5, verdict.TIE_THRESHOLD
GOAL_COST, GOAL_MATCH, GOAL_WRONG = 0.40, 0.95, 0.05
WARMUP, MEASURE, STARTUP_S = 2, 5, 30.0
SPREADS = (0.01, 0.02, 0.03)
STEP_JITTER = 0.01
Layout = tuple[int, int]


@dataclass
class Key:
    """One key's replays: ``sample(i)`` gives replay ``i``'s truth (per layout) and its
    draw of one trial's median. ``held_out``: the key is used only to report, never to
    choose a default."""

    group: str
    name: str
    gpus: int
    held_out: bool
    layouts: list[Layout]
    sample: Callable[[int], tuple[dict[Layout, float], Callable[[random.Random, Layout], float]]]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pool_key(group: str, name: str, rows: list[dict], session: str) -> Key:
    """A recorded key, replayed as users run it: replay ``i`` draws every layout's trials
    from one recorded session (``rows[session]``, in turn); its truth is the median of the
    other sessions' trials (the same session's when it is the only one)."""
    by: dict[str, dict[Layout, list[float]]] = {}
    for r in rows:
        if r.get("status", "ok") == "ok" and r.get("median_s"):
            by.setdefault(str(r.get(session)), {}).setdefault(
                (int(r["a2a"]), int(r["p2p"])), []).append(float(r["median_s"]))
    tags = sorted(by)

    def sample(i: int):
        pool = by[tags[i % len(tags)]]
        others = [t for t in tags if t != tags[i % len(tags)]] or tags
        truth = {lay: statistics.median([m for t in others for m in by[t][lay]]) for lay in pool}
        return truth, lambda rng, lay: rng.choice(pool[lay])

    return Key(group, f"{name} ({len(tags)} session(s))", int(rows[0]["cp"]) * int(
        rows[0].get("tp") or 1), True, sorted(by[tags[0]]), sample)


def _table_keys(group: str, rows: list[dict], spread: float) -> list[Key]:
    """A table's keys with the stated noise model; every other key (in sorted order) is a
    tuning key, the rest are held out."""
    by: dict[tuple, dict[Layout, list[float]]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok" or not r.get("median_s"):
            continue
        k = (r.get("env_tag"), r.get("model"), r["cp"], r.get("tp", 1), r["seq"])
        by.setdefault(k, {}).setdefault((int(r["a2a"]), int(r["p2p"])), []).append(
            float(r["median_s"]))
    out = []
    for i, (k, lays) in enumerate(sorted(by.items(), key=str)):
        if len(lays) < 2:
            continue
        truth = {lay: statistics.median(v) for lay, v in lays.items()}
        out.append(Key(f"{group}, s={spread:.0%}", f"{k[1]} cp={k[2]} seq={k[4]}",
                       int(k[2]) * int(k[3]), i % 2 == 1, sorted(truth),
                       lambda i, t=truth, s=spread: (t, lambda rng, lay: t[lay] * math.exp(
                           rng.gauss(0, s)))))
    return out


def keys() -> list[Key]:
    pool = _rows(B / "regress_pool_rows.jsonl")
    out = [_pool_key("CPU pools (recorded)", f"cp=2 seq=1024 {name}",
                     [r for r in pool if r["env_tag"] in tags], "env_tag")
           for name, tags in (("clean pool-1..4", ("pool-1", "pool-2", "pool-3", "pool-4")),
                              ("delay-1..2", ("delay-1", "delay-2")),
                              ("bigdelay-1", ("bigdelay-1",)))]
    out.append(_pool_key("this issue's recording", "cp=4 seq=2048 (5 trials a layout)",
                         _rows(B / "decision_cost_rows.jsonl"), "env_tag"))
    gpu = _rows(B / "recordings/h200-attention-compute.jsonl")
    for seq in sorted({r["seq"] for r in gpu}):
        out.append(_pool_key("H200 recording (real GPU noise)", f"cp=8 seq={seq} compute",
                             [r for r in gpu if r["seq"] == seq], "session"))
    published = _rows(B / "published/yunchang-a100-fwd.jsonl") + \
        _rows(B / "published/yunchang-a100-fwdbwd.jsonl")
    cpu_tables = _rows(B / "cpu_splits_rows.jsonl") + _rows(B / "calibrate_cpu_rows.jsonl")
    for s in SPREADS:
        out += _table_keys("published 8xA100 tables", published, s)
        out += _table_keys("CPU layout tables", cpu_tables, s)
    return out


def _trial(rng: random.Random, draw: Callable, lay: Layout) -> dict:
    median = draw(rng, lay)
    steps = [median * math.exp(rng.gauss(0, STEP_JITTER)) for _ in range(MEASURE)]
    return {"a2a": lay[0], "p2p": lay[1], "status": "ok", "verified": True,
            "median_s": percentile(steps, 50), "p10_s": percentile(steps, 10),
            "p90_s": percentile(steps, 90), "peak_mem_bytes": 0, "steps": steps}


def replay(key: Key, truth: dict[Layout, float], draws: dict[Layout, list[dict]],
           adaptive: bool, fastest_first: bool, min_repeats: int) -> tuple[list, float]:
    """The sweep's loop for one key, one trial at a time; (stored rows, GPU-hours).
    ``fastest_first``: the layouts in the truth's order (search.order_by_prediction with a
    prediction that ranks right); else in candidate order (a2a ascending)."""
    layouts = sorted(truth, key=truth.get) if fastest_first else sorted(truth)
    kept = [a for a, _ in layouts]
    queue = [lay for _ in range(min_repeats if adaptive else REPEATS) for lay in layouts]
    rows: list[dict] = []
    used = {lay: 0 for lay in layouts}
    hours = 0.0
    while queue:
        lay = queue.pop(0)
        t = dict(draws[lay][used[lay]])
        used[lay] += 1
        figs = verdict.figures(rows, intervals=False)
        ref = figs[0].row if figs and figs[0].layout != lay else None
        steps = t.pop("steps")
        if ref is not None and should_prune(steps[:MIN_STEPS_TO_PRUNE], ref):
            rows.append({**t, "status": "pruned", "median_s": statistics.median(
                steps[:MIN_STEPS_TO_PRUNE])})
            hours += key.gpus * (STARTUP_S + (WARMUP + MIN_STEPS_TO_PRUNE) * t["median_s"]) / 3600
            if adaptive:
                queue = [q for q in queue if q != lay]
        else:
            rows.append(t)
            hours += key.gpus * (STARTUP_S + (WARMUP + MEASURE) * t["median_s"]) / 3600
        if adaptive and not queue:
            more = sweep_adaptive.next_round(rows, kept, min_repeats=min_repeats,
                                             repeats=REPEATS, tie_threshold=THRESHOLD)
            queue = [next(x for x in layouts if x[0] == a) for a in more]
    return rows, hours


FIELDS = ("keys", "replays", "ex_trials", "ad_trials", "ex_h", "ad_h", "match", "settled",
          "wrong", "far", "tie", "tie_wrong", "unsettled", "ex_settled", "ex_wrong")


def measure(keys_: list[Key], replays: int, fastest_first: bool,
            min_repeats: int) -> dict[str, dict[str, float]]:
    """Per group, the counts of ``FIELDS`` over ``replays`` replays of each key."""
    stats: dict[str, dict[str, float]] = {}
    for key in keys_:
        rng = random.Random(f"{key.group}|{key.name}")
        s = stats.setdefault(key.group, dict.fromkeys(FIELDS, 0))
        s["keys"] += 1
        for i in range(replays):
            truth, draw = key.sample(i)
            true_best = min(truth, key=truth.get)
            draws = {lay: [_trial(rng, draw, lay) for _ in range(REPEATS)] for lay in truth}
            ex_rows, ex_h = replay(key, truth, draws, False, fastest_first, min_repeats)
            ad_rows, ad_h = replay(key, truth, draws, True, fastest_first, min_repeats)
            ex, ad = verdict.decide(ex_rows, THRESHOLD), verdict.decide(ad_rows, THRESHOLD)
            eb, ab = ex.best.layout, ad.best.layout
            for k, v in (("replays", 1), ("ex_trials", len(ex_rows)),
                         ("ad_trials", len(ad_rows)), ("ex_h", ex_h), ("ad_h", ad_h),
                         ("match", ab == eb or (ad.kind == "tie" and eb in ad.tied)
                          or (ex.kind == "tie" and ab in ex.tied)),
                         (ad.kind, 1), ("wrong", ad.kind == "settled" and ab != true_best),
                         # practically wrong: more than the tie threshold slower than the best
                         ("far", ad.kind == "settled"
                          and truth[ab] > truth[true_best] * (1 + THRESHOLD)),
                         # a wrong tie: the truth's fastest not in it, or a tied layout
                         # more than the threshold slower than the truth's fastest
                         ("tie_wrong", ad.kind == "tie" and (
                             true_best not in ad.tied or max(truth[x] for x in ad.tied)
                             > truth[true_best] * (1 + THRESHOLD))),
                         ("ex_settled", ex.kind == "settled"),
                         ("ex_wrong", ex.kind == "settled" and eb != true_best)):
                s[k] += v
    return stats


def total(stats: dict[str, dict[str, float]]) -> dict[str, float]:
    return {k: sum(s[k] for s in stats.values()) for k in FIELDS}


def meets(t: dict[str, float]) -> bool:
    """The issue's goals on point estimates: <= 40% of the trials, >= 95% agreement,
    <= 5% wrong "settled"."""
    return (t["ad_trials"] <= GOAL_COST * t["ex_trials"] and t["match"] >= GOAL_MATCH * t["replays"]
            and t["wrong"] <= GOAL_WRONG * max(1, t["settled"]))


def headline(t: dict[str, float], what: str) -> str:
    n = int(t["replays"])
    return (f"**{what}** ({n} replays): adaptive measures **{t['ad_trials'] / t['ex_trials']:.1%}"
            f" of the exhaustive trials** ({t['ad_h'] / t['ex_h']:.0%} of its GPU-hours); "
            f"same winner or a correct tie in **{rate(int(t['match']), n)}** of replays; a "
            f"\"settled\" pick that is not the truth's fastest in "
            f"**{rate(int(t['wrong']), int(t['settled']))}** of settled verdicts, one more "
            f"than 2% slower than it in **{rate(int(t['far']), int(t['settled']))}** "
            f"(exhaustive, any: {rate(int(t['ex_wrong']), int(t['ex_settled']))}); a "
            f"declared tie that is wrong (the truth's fastest not in it, or a tied layout more "
            f"than 2% slower than it) in **{rate(int(t['tie_wrong']), int(t['tie']))}** of "
            f"ties.")


def table(stats: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| keys | group | trials adaptive / exhaustive | GPU-hours adaptive / exhaustive "
             "| same winner or correct tie | adaptive: settled / tie / unsettled "
             "| wrong \"settled\" (any / > 2% slower) | exhaustive: wrong \"settled\" |",
             "|---:|---|---:|---:|---|---|---|---|"]
    for group, s in stats.items():
        n = int(s["replays"])
        lines.append(
            f"| {int(s['keys'])} | {group} | {s['ad_trials'] / s['ex_trials']:.0%} "
            f"({s['ad_trials'] / n:.1f} / {s['ex_trials'] / n:.1f} a key) "
            f"| {s['ad_h'] / s['ex_h']:.0%} | {rate(int(s['match']), n)} "
            f"| {s['settled'] / n:.0%} / {s['tie'] / n:.0%} / {s['unsettled'] / n:.0%} "
            f"| {rate(int(s['wrong']), int(s['settled']))} / "
            f"{rate(int(s['far']), int(s['settled']))} "
            f"| {rate(int(s['ex_wrong']), int(s['ex_settled']))} |")
    return lines


def shipped_min_repeats() -> int:
    """``search.min_repeats`` as conf/search/default.yaml ships it."""
    text = (REPO / "conf/search/default.yaml").read_text()
    return int(re.search(r"^min_repeats:\s*(\d+)", text, re.M).group(1))


def frozen_at() -> str:
    """The commit that last changed the rule evaluated (its code and its defaults)."""
    paths = ["conf/search/default.yaml", "hcp_tune/engine/verdict.py",
             "hcp_tune/engine/sweep_adaptive.py", "hcp_tune/engine/shrinkage.py"]
    out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", *paths], cwd=REPO,
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def tuning(keys_: list[Key], replays: int) -> list[str]:
    tune = [k for k in keys_ if not k.held_out]
    lines = ["## Tuning: choosing search.min_repeats (tuning keys only)", "",
             f"{len(tune)} tuning keys (every other key of the two tables, in sorted order, "
             "at each spread), layouts in candidate order. The rule: the smallest "
             "min_repeats whose figures meet the accuracy goals (same winner or a correct tie "
             ">= 95%, wrong \"settled\" <= 5%); among those, cost decides.", "",
             "| min_repeats | trials adaptive / exhaustive | same winner or correct tie "
             "| wrong \"settled\" | meets the issue's goals |", "|---:|---:|---|---|---|"]
    chosen = None
    for m in (1, 2, 3):
        t = total(measure(tune, replays, False, m))
        ok_acc = (t["match"] >= GOAL_MATCH * t["replays"]
                  and t["wrong"] <= GOAL_WRONG * max(1, t["settled"]))
        if ok_acc and chosen is None:
            chosen = m
        lines.append(f"| {m} | {t['ad_trials'] / t['ex_trials']:.0%} "
                     f"| {rate(int(t['match']), int(t['replays']))} "
                     f"| {rate(int(t['wrong']), int(t['settled']))} | {'yes' if meets(t) else 'no'} |")
    lines += ["", f"The rule chooses **min_repeats={chosen}**; conf/search/default.yaml ships "
              f"**{shipped_min_repeats()}**."]
    return lines


def evaluation(keys_: list[Key], replays: int) -> list[str]:
    held = [k for k in keys_ if k.held_out]
    m = shipped_min_repeats()
    lines = [f"## Held-out evaluation: the shipped default (min_repeats={m}), keys never used "
             "to choose it", "",
             f"{len(held)} keys: the other half of the tables, and every recorded key replayed "
             "one session at a time against the other sessions' medians. The rule evaluated "
             f"was frozen at commit {frozen_at()} (its code and conf/search/default.yaml)."]
    for fastest_first in (False, True):
        stats = measure(held, replays, fastest_first, m)
        t = total(stats)
        lines += ["", "### " + ("layouts measured fastest first (search.order_by_prediction "
                                "with a prediction that ranks right)" if fastest_first else
                                "layouts in candidate order (a2a ascending: no help from the "
                                "prediction): the figures `recommend` states"), ""]
        lines += table(stats)
        lines += ["", headline(t, "All held-out keys") + (
            " Meets the issue's goals." if meets(t) else " Misses a goal of the issue.")]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--out", default=str(B / "RESULTS-decision-cost.md"))
    ap.add_argument("--tune-only", action="store_true",
                    help="print the tuning part only (no held-out key is replayed)")
    args = ap.parse_args()
    keys_ = keys()
    if args.tune_only:
        print("\n".join(tuning(keys_, args.replays)))
        return
    blocks = ["# Decision cost: adaptive vs exhaustive measuring (issue 28)",
              f"Each key replayed {args.replays} times per policy on the same draws "
              "(benchmarks/decision_cost.py says how), as users run a sweep: one session, "
              "every layout of the key measured in it. Exhaustive: search.adaptive=false "
              "search.repeats=5; adaptive: search.min_repeats trials a layout, then only the "
              "undecided, up to 5; tie threshold 2%; early stopping on in both. Goal (issue "
              "28): <= 40% of the exhaustive cost, same winner or a correct tie >= 95%, wrong "
              "\"settled\" <= 5%.",
              "\n".join(tuning(keys_, args.replays)),
              "\n".join(evaluation(keys_, args.replays))]
    write_results(args.out, "\n\n".join(blocks))
    print("\n\n".join(blocks))


if __name__ == "__main__":
    main()
