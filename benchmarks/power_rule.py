"""The power rule behind "about N more trial(s)": does measuring up to N settle the key?

An unsettled key's output (`recommend`, the sweep's table) names the undecided layouts and
how many trials each needs in all (`engine.verdict.trials_to_decide`: 80% power by the
normal approximation of a ratio of medians, the spread at its 80% upper bound). Issue 28's
goal: the suggested trials settle (or tie) >= 80% of such keys.

Each simulated key: 2 or 4 layouts, log-normal trial medians with spread s (sd of log), the
best at 1.00 and the others' true ratios drawn from 1.00-1.06 (around the 2% tie
threshold, where keys stay unsettled). Every layout gets n0 trials (3, or the cap 5 of an
adaptive sweep); a key still unsettled then is one the suggestion is for: each undecided
layout is measured up to the suggested count, and `verdict.decide` judges again. Reported:
the share that ends settled or a tie (with a Wilson 95% interval), the share of those
decisions that are right (settled on the true fastest; a tie that holds it and no layout
more than 2% slower), and the suggested counts. The rule was not tuned on these draws:
seeds from 1,000,000 (tests/engine/test_verdict.py checks the same rule at seed 28 and
smaller sizes).

    PYTHONPATH=$PWD python benchmarks/power_rule.py [--keys 400]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hcp_tune.engine import verdict  # noqa: E402
from rates import wilson  # noqa: E402

THRESHOLD = 0.02
CP = 4


def _rows(a2a: int, medians: list[float]) -> list[dict]:
    return [{"a2a": a2a, "p2p": CP // a2a, "status": "ok", "verified": True,
             "median_s": m, "peak_mem_bytes": 0, "comm_type": "a2a"} for m in medians]


def one_key(rng: random.Random, layouts: int, spread: float, n0: int):
    """None when the key is decided at n0 trials; else (decided, right, suggested n)."""
    a2as = [1, 2, 4, 8][:layouts]
    truth = {1: 1.0, **{a: 1.0 + rng.randrange(7) / 100 for a in a2as[1:]}}

    def draw(a: int, n: int) -> list[float]:
        return [math.exp(rng.gauss(math.log(truth[a]), spread)) for _ in range(n)]

    trials = {a: draw(a, n0) for a in a2as}
    v = verdict.decide([r for a in a2as for r in _rows(a, trials[a])], THRESHOLD)
    if v.kind != "unsettled":
        return None
    have = {f.layout: f.n_trials for f in v.figures}
    n = max(have[lay] + v.more_trials[lay] for lay in v.undecided)
    for lay in v.undecided:
        a = lay[0]
        trials[a] += draw(a, n - len(trials[a]))
    v = verdict.decide([r for a in a2as for r in _rows(a, trials[a])], THRESHOLD)
    fastest = min(truth.values())
    if v.kind == "settled":
        right = truth[v.best.layout[0]] == fastest
    elif v.kind == "tie":
        tied = [truth[lay[0]] for lay in v.tied]
        right = fastest in tied and max(tied) <= fastest * (1 + THRESHOLD)
    else:
        right = None
    return v.kind != "unsettled", right, n


def cell(seed: int, keys: int, layouts: int, spread: float, n0: int) -> dict:
    rng = random.Random(seed)
    got, tries = [], 0
    while len(got) < keys and tries < 200 * keys:
        tries += 1
        r = one_key(rng, layouts, spread, n0)
        if r is not None:
            got.append(r)
    decided = [r for r in got if r[0]]
    right = sum(1 for r in decided if r[1])
    ns = sorted(r[2] for r in got)
    return {"keys": len(got), "unsettled_share": len(got) / tries, "decided": len(decided),
            "right": right, "n_median": statistics.median(ns),
            "n_p90": ns[int(0.9 * (len(ns) - 1))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=400, help="unsettled keys per row")
    ap.add_argument("--seed", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-power-rule.md"))
    args = ap.parse_args()
    t0 = time.monotonic()
    lines = ["| layouts | spread | trials first | keys unsettled then | settled or tie after the "
             "suggested trials | of those, right | suggested trials in all (median / p90) |",
             "|---:|---:|---:|---|---|---|---|"]
    tot_k = tot_d = tot_r = 0
    for i, (layouts, spread, n0) in enumerate(
            (lay, s, n) for lay in (2, 4) for s in (0.01, 0.02, 0.03) for n in (3, 5)):
        c = cell(args.seed + i, args.keys, layouts, spread, n0)
        lo, hi = wilson(c["decided"], c["keys"])
        rlo, rhi = wilson(c["right"], c["decided"])
        lines.append(
            f"| {layouts} | {spread:.0%} | {n0} | {c['keys']} ({c['unsettled_share']:.0%}) | "
            f"{c['decided'] / c['keys']:.1%} [{lo:.1%}, {hi:.1%}] | "
            f"{c['right'] / max(1, c['decided']):.1%} [{rlo:.1%}, {rhi:.1%}] | "
            f"{c['n_median']:.0f} / {c['n_p90']} |")
        tot_k, tot_d, tot_r = tot_k + c["keys"], tot_d + c["decided"], tot_r + c["right"]
        print(lines[-1], flush=True)
    lo, hi = wilson(tot_d, tot_k)
    rlo, rhi = wilson(tot_r, tot_d)
    verdict_line = "meets" if lo >= 0.8 else ("meets on its point estimate"
                                              if tot_d / tot_k >= 0.8 else "misses")
    from stamp import write_simulation

    write_simulation(
        args.out, "The power rule: do the suggested trials settle the key? (issue 28)",
        __doc__ or "", lines,
        f"**All rows** ({tot_k} unsettled keys): the suggested trials settle or tie "
        f"**{tot_d / tot_k:.1%} [{lo:.1%}, {hi:.1%}]** of them (goal >= 80%: {verdict_line}); "
        f"the decision is right in **{tot_r / max(1, tot_d):.1%} [{rlo:.1%}, {rhi:.1%}]**. "
        f"{time.monotonic() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
