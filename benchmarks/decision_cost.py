"""How often each verdict of an adaptive sweep is wrong, and what it costs, per noise
regime: the real sweep loop (``runner=synthetic``) on designed truths, one row a regime.

Each regime is a truth file: 4 layouts (cp=8, model=tiny: a2a = 1, 2, 4, 8) with their
true step times and how their trials scatter, and a session model. ``python -m hcp_tune
sweep ... runner=synthetic`` runs it as a user would (``synthetic_loop.sweep``: the CLI
in this process, its output silenced), at the defaults (adaptive: one trial a layout,
then only the undecided ones, up to ``search.repeats=5``; early stopping on; layouts in
candidate order, no help from a prediction). Many keys a sweep: each key is its own
session of the truth (its own draws of the session shift and the per-layout effects).
Then every key's verdict and recommendation are read back from what the sweep stored.

Measured per regime: the verdicts' shares; a **wrong settled** (the pick is not the
session's true fastest, or the fastest are exactly equal: then no pick is right); a
**wrong tie** (the true fastest is not among the tied, or a tied layout is truly more
than the tie threshold slower); the **cost** (trials run over the exhaustive sweep's 4 x
5 = 20; a pruned trial counts whole) and how often early stopping pruned the true
fastest. Rates with 95% Wilson intervals. Goals (issue 36): exactly equal layouts settled
in <= 5% of keys; wrong settled <= 5% in every regime; cost <= 40% on clear keys (layouts
>= 10% apart).

**Tuning and held-out.** ``--tuning`` runs the regimes at other spacings and seeds (the
runs the rule was built with); the held-out run uses the spacings below and seeds never
used before, and states whether the rule files are unchanged since the freeze
(``synthetic_loop.FROZEN_AT``).

    PYTHONPATH=$PWD python benchmarks/decision_cost.py [--keys 400] [--tuning]
        [--out benchmarks/RESULTS-decision-cost.md]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_loop as loop  # noqa: E402
from rates import rate  # noqa: E402
from stamp import write_simulation  # noqa: E402

TIE = 0.02  # search.tie_threshold's default
EXHAUSTIVE = 4 * 5  # trials: 4 layouts x search.repeats=5


def _ln(cv: float) -> dict[str, Any]:
    return {"kind": "lognormal", "cv": cv}


def regimes(tuning: bool) -> list[tuple[str, dict[str, Any]]]:
    """(name, truth) per regime; the tuning run's spacings differ from the held-out's."""
    clear = [1.0, 1.12, 1.25, 1.40] if tuning else [1.0, 1.10, 1.21, 1.33]
    close = [1.0, 1.025, 1.05, 1.12] if tuning else [1.0, 1.03, 1.06, 1.15]
    near = [1.0, 1.015, 1.03, 1.045] if tuning else [1.0, 1.02, 1.04, 1.03]
    t3 = {"kind": "t3", "cv": 0.02}
    bimodal = {"kind": "bimodal", "cv": 0.01, "p": 0.3, "shift": 0.06}
    d = loop.truth_doc
    return [
        ("clear, log-normal 2% (>= 10% apart)", d(clear, [_ln(0.02)] * 4)),
        ("clear, log-normal 3%", d(clear, [_ln(0.03)] * 4)),
        ("close, log-normal 1% (3-6% apart, one 15%)", d(close, [_ln(0.01)] * 4)),
        ("close, log-normal 2%", d(close, [_ln(0.02)] * 4)),
        ("close, log-normal 3%", d(close, [_ln(0.03)] * 4)),
        ("close, Student-t(3) tails 2%", d(close, [t3] * 4)),
        ("close, bimodal (30% of trials 6% slow)", d(close, [bimodal] * 4)),
        ("close, the best 5% noisy, rivals 1%", d(close, [_ln(0.05)] + [_ln(0.01)] * 3)),
        ("close, a rival 5% noisy, the rest 1%", d(close, [_ln(0.01), _ln(0.05)] + [_ln(0.01)] * 2)),
        ("close, 2% with a 5% drift over the sweep", d(close, [_ln(0.02)] * 4, {"drift": 0.05})),
        ("4 layouts within 2-4%, log-normal 2%", d(near, [_ln(0.02)] * 4)),
        ("exactly equal, log-normal 2%", d([1.0] * 4, [_ln(0.02)] * 4)),
        ("two equal best, log-normal 2%", d([1.0, 1.0, 1.10, 1.20], [_ln(0.02)] * 4)),
        ("close, 2%, per-layout session effect N(0, 2%)",
         d(close, [_ln(0.02)] * 4, {"layout_sd": 0.02})),
        *([] if tuning else [recorded(32768), recorded(131072)]),
    ]


RECORDING = Path(__file__).resolve().parent / "recordings" / "h200-attention-compute.jsonl"


def recorded(seq: int) -> tuple[str, dict[str, Any]]:
    """A regime from the H200 recording (gpu_recording.py: one CP rank's attention compute
    for the 4 splits of cp=8, 8 trials a layout in each of 6 sessions on two machines):
    each layout's true time the mean of its sessions' log trial medians, the trials'
    log-normal spread the pooled within-session one, the session's common shift and the
    layout x session effect from the session means (a two-way decomposition)."""
    import math
    import statistics as st

    rows = [json.loads(ln) for ln in RECORDING.read_text().splitlines() if ln.strip()]
    cell: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["seq"] == seq:
            cell.setdefault((r["session"], r["a2a"]), []).append(math.log(r["median_s"]))
    sessions = sorted({s for s, _ in cell})
    m = {k: st.mean(v) for k, v in cell.items()}
    lay = {a: st.mean(m[(s, a)] for s in sessions) for a in loop.LAYOUTS}
    shift = {s: st.mean(m[(s, a)] - lay[a] for a in loop.LAYOUTS) for s in sessions}
    inter = [m[(s, a)] - lay[a] - shift[s] for s in sessions for a in loop.LAYOUTS]
    cv = math.sqrt(st.mean(st.variance(v) for v in cell.values()))
    session = {"shift_sd": st.stdev(shift.values()), "layout_sd": math.sqrt(
        sum(x * x for x in inter) / ((len(sessions) - 1) * (len(loop.LAYOUTS) - 1)))}
    name = (f"H200 recording, seq {seq // 1024}K (trials {cv:.1%}, session "
            f"{session['shift_sd']:.1%}, layout x session {session['layout_sd']:.1%})")
    return name, loop.truth_doc([math.exp(lay[a]) for a in loop.LAYOUTS],
                                [_ln(cv)] * 4, session)


def judge(truth: dict[str, Any], seed: int, key: Any, rows: list[dict[str, Any]],
          rec: dict[str, Any]) -> dict[str, Any]:
    """One key's outcome against the truth of its session (and, for the session-effect
    regime, against the truth's long-run medians)."""
    true = loop.true_medians(truth, seed, key)
    fastest = min(true.values())
    best = {a for a, m in true.items() if m == fastest}
    longrun = {int(a): v["median_s"] for a, v in truth["layouts"].items()}
    lr_best = {a for a, m in longrun.items() if m == min(longrun.values())}
    kind, pick = rec.get("verdict", "unsettled"), rec.get("a2a")
    tied = [int(x.strip("[]").split(",")[0]) for x in str(rec.get("tied") or "").split()]
    wrong_tie = kind == "tie" and (not best & set(tied) or any(
        true[a] > fastest * (1 + TIE) for a in tied))
    return {
        "kind": kind,
        "wrong_settled": kind == "settled" and (pick not in best or len(best) > 1),
        "wrong_settled_longrun": kind == "settled" and (pick not in lr_best or len(lr_best) > 1),
        "wrong_tie": wrong_tie,
        "trials": len(rows),
        "best_pruned": any(r["status"] == "pruned" and int(r["a2a"]) in best for r in rows),
    }


def run_regime(truth: dict[str, Any], keys: int, seed: int) -> list[dict[str, Any]]:
    _, folder = loop.sweep(truth, seed=seed, keys=keys)
    return [judge(truth, seed, key, rows, rec) for key, rows, rec in loop.stored(folder)]


def table(results: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    out = ["| regime | keys | settled | tie | unsettled | wrong settled (of keys) | "
           "wrong tie (of keys) | trials / exhaustive | true best pruned |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, got in results:
        n = len(got)
        kinds = {k: sum(g["kind"] == k for g in got) for k in ("settled", "tie", "unsettled")}
        ties = kinds["tie"]
        wrong = sum(g["wrong_settled"] for g in got)
        extra = ""
        if "session" in name:
            extra = f"; vs the long-run truth {rate(sum(g['wrong_settled_longrun'] for g in got), n)}"
        cost = sum(g["trials"] for g in got) / (n * EXHAUSTIVE)
        out.append(
            f"| {name} | {n} | {kinds['settled'] / n:.1%} | {ties / n:.1%} | "
            f"{kinds['unsettled'] / n:.1%} | {rate(wrong, n)}{extra} | "
            f"{rate(sum(g['wrong_tie'] for g in got), n)} | {cost:.1%} | "
            f"{rate(sum(g['best_pruned'] for g in got), n)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=400, help="keys (sessions) per regime")
    ap.add_argument("--tuning", action="store_true",
                    help="the tuning spacings and seeds (what the rule was built with)")
    ap.add_argument("--only", default="", help="run only regimes whose name holds this")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None, help="also write the per-regime outcomes here")
    args = ap.parse_args(argv)
    seed0 = 10_000 if args.tuning else 20_000
    results = []
    for i, (name, truth) in enumerate(regimes(args.tuning)):
        if args.only and args.only not in name:
            continue
        got = run_regime(truth, args.keys, seed0 + i)
        results.append((name, got))
        print(table([(name, got)])[-1], flush=True)
    status = ("tuning run (the spacings and seeds the rule was built with)" if args.tuning
              else loop.held_out_status())
    lines = table(results)
    if args.json:
        Path(args.json).write_text(json.dumps({n: g for n, g in results}))
    if args.out:
        write_simulation(args.out, "Decision cost and error rates of the verdicts, per regime",
                         __doc__, [f"Status: {status}.", "", *lines],
                         "Each regime's figures stand on their own row: none is pooled.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
