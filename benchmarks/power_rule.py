"""The power rule behind "about N more trial(s)": does the command an unsettled key prints
settle it?

An unsettled key's output (`recommend`, the sweep's table) names the undecided layouts, how
many trials each needs in all (``engine.verdict.trials_to_decide``: 80% power at the level
of the look it will be decided at) and the command that measures only them
(``outputs.recommend.measure_command``). Goal: the command settles (or ties) >= 80% of
such keys, and the decisions it leads to are right.

Through the real loop (``synthetic_loop``): an adaptive sweep at the defaults on a regime of
decision_cost.py (held-out spacings, seeds of their own); for every key it leaves
unsettled, the very command `recommend` prints is run as typed (the CLI, in this process,
into the same results folder); the key's verdict is then read back. Reported per regime:
the unsettled keys, the share the command settled or tied, the share of those decisions
that are right (settled on the session's true fastest; a tie holding it with no layout
truly more than 2% slower), and the median and largest trials a layout it asked for.

    PYTHONPATH=$PWD python benchmarks/power_rule.py [--keys 100]
        [--out benchmarks/RESULTS-power-rule.md]
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_loop as loop  # noqa: E402
from decision_cost import TIE, judge, regimes  # noqa: E402
from rates import rate  # noqa: E402
from stamp import write_simulation  # noqa: E402

from hcp_tune.outputs.recommend import measure_command  # noqa: E402

REGIMES = ("close, log-normal 2%", "close, Student-t(3) tails 2%",
           "4 layouts within 2-4%, log-normal 2%", "close, the best 5% noisy, rivals 1%")


def settle(truth: dict, keys: int, seed: int) -> dict:
    _, folder = loop.sweep(truth, seed=seed, keys=keys)
    unsettled = [(k, rec) for k, _, rec in loop.stored(folder) if rec.get("verdict") == "unsettled"
                 and rec.get("undecided")]
    asked = []
    for _, rec in unsettled:
        cmd = measure_command(rec, str(folder / "results"))
        args = shlex.split(cmd)[3:]  # after "python -m hcp_tune"
        asked.append(int(args[-1].split("=")[1]))
        loop.run_cli([*args, f"runner.truth={folder / 'truth.json'}", f"runner.seed={seed}",
                      "search.order_by_prediction=false"])
    after = {k.seq: judge(truth, seed, k, rows, rec) for k, rows, rec in loop.stored(folder)}
    got = [after[k.seq] for k, _ in unsettled]
    decided = [g for g in got if g["kind"] != "unsettled"]
    right = [g for g in decided if not g["wrong_settled"] and not g["wrong_tie"]]
    return {"keys": keys, "unsettled": len(got), "decided": len(decided), "right": len(right),
            "asked": asked}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = ["| regime | keys | unsettled after the adaptive sweep | settled or tie after the "
             "command | of those, right | trials a layout asked (median / most) |",
             "|---|---:|---:|---|---|---|"]
    total = [0, 0]
    for i, (name, truth) in enumerate(regimes(False)):
        if name not in REGIMES:
            continue
        g = settle(truth, args.keys, 50_000 + i)
        total[0] += g["decided"]
        total[1] += g["unsettled"]
        asked = g["asked"] or [0]
        lines.append(f"| {name} | {g['keys']} | {g['unsettled']} | {rate(g['decided'], g['unsettled'])} "
                     f"| {rate(g['right'], g['decided'])} | {statistics.median(asked):.0f} / "
                     f"{max(asked)} |")
        print(lines[-1], flush=True)
    if args.out:
        write_simulation(args.out, "The power rule: do the printed commands settle the key?",
                         __doc__, [f"Status: {loop.held_out_status()}.", "", *lines],
                         f"**All rows**: the command settled or tied {rate(*total)} of the "
                         f"unsettled keys (goal >= 80%); tie threshold {TIE:.0%}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
