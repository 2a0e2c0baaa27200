"""Check the cost model's order of splits against published GPU tables, and calibrate on them.

For each table in ``benchmarks/published/*.jsonl`` (calibration rows, one per measured
split, with their source): the agreement of the model's predicted order of each key's
splits with the measured order (Kendall tau, predicted best in the measured top two, the
predicted best's measured slowdown) with (1) the uncalibrated defaults, (2) a calibration
on the whole table (in-sample), and (3) leave-one-key-out: for each key, a calibration on
the table's other keys predicts that key (held out). Writes the Markdown summary and stores
the whole-table calibration beside the table (``benchmarks/published/calibration/``).

    python benchmarks/published_check.py [--out benchmarks/RESULTS-published.md]

About a minute on 2 cores (scipy least squares, 6 fits per table).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLES = REPO / "benchmarks" / "published"
N_STARTS = 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-published.md"))
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from hcp_tune.costmodel import agreement, calibrate
    from hcp_tune.costmodel.formulas import CostParams

    out = ["# The cost model against published split measurements\n",
           "Produced by `python benchmarks/published_check.py`. Orders are a2a sizes, fastest "
           "first; tau is Kendall's tau between the predicted and measured order of a key's "
           "splits; slowdown is how much slower the predicted best measured than the "
           "measured best.\n"]
    for path in sorted(TABLES.glob("*.jsonl")):
        rows = calibrate.read_rows(str(path))
        t0 = time.time()
        out.append(f"## `{path.relative_to(REPO)}`\n\nSource: {rows[0]['source']}.\n")
        default = agreement.agreement(rows, CostParams())
        out.append("### Uncalibrated defaults\n\n" + agreement.table(default) + "\n")
        params, rep = calibrate.fit(rows, n_starts=N_STARTS)
        stored = calibrate.save_params(TABLES, rows[0]["cluster"], rows[0]["env_tag"], params, rep)
        fitted = ", ".join(f"{n}={getattr(params, n):.4g}" for n in rep.fitted)
        out.append(f"### Calibrated on the whole table (in-sample)\n\nFitted: {fitted}; rms "
                   f"relative error of the times {rep.rms_rel_error:.1%} (stored as "
                   f"`{stored.relative_to(REPO)}`).\n\n"
                   + agreement.table(agreement.agreement(rows, params)) + "\n")
        held = []
        keys = agreement.keys_of(rows)
        for key in dict.fromkeys(keys):
            train = [r for r, k in zip(rows, keys) if k != key]
            test = [r for r, k in zip(rows, keys) if k == key]
            p, _ = calibrate.fit(train, n_starts=N_STARTS)
            held += agreement.agreement(test, p)
        out.append("### Leave one key out (each key predicted by a calibration on the "
                   "others)\n\n" + agreement.table(held) + "\n")
        out.append(f"({time.time() - t0:.0f} s)\n")
    from hcp_tune import config

    clusters = {n: config.load([f"cluster={n}"]).cluster for n in agreement.TE_STUDY_CLUSTERS}
    out.append("## TE's attention study pattern (uncalibrated defaults)\n\n"
               "Pure p2p [1,cp] vs pure a2a [cp,1], 32 Q / 8 KV heads, d128, one layer forward "
               f"and backward, seq {list(agreement.TE_STUDY_SEQS)} x mbs "
               f"{list(agreement.TE_STUDY_MBS)} per cluster. TE found P2P winning most CP2 "
               "cases and A2A most CP4 and CP8 cases.\n\n"
               "| cp | " + " | ".join(f"{n} p2p / a2a wins" for n in clusters) + " | all |\n"
               "|---|" + "---|" * (len(clusters) + 1))
    for cp in (2, 4, 8):
        w = agreement.te_study_winners(cp, clusters)
        out.append(f"| {cp} | " + " | ".join(f"{w[n]['p2p']} / {w[n]['a2a']}" for n in clusters)
                   + f" | {w['all']['p2p']} / {w['all']['a2a']} |")
    out.append("")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results

    write_results(args.out, "\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
