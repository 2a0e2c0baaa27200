"""Measure every split at cp=2 and cp=4 for the tiny (MHA) and tiny-gqa models on this CPU,
and compare the cost model's order of the splits with the measured order.

The rows (``benchmarks/cpu_splits_rows.jsonl``) are not used to fit anything: the model is
the uncalibrated defaults, and the calibration fitted on ``calibrate_cpu_rows.jsonl`` (tiny,
cp=4 and cp=8), for which cp=2 and the GQA model are held out. cp=8 is left out here: on 2
cores it measures oversubscription more than the layouts.

    python benchmarks/cpu_splits.py [--rows FILE] [--out benchmarks/RESULTS-cpu-splits.md]

About 3 minutes of measuring on 2 cores; ``--rows`` refits measured rows instead.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

SEQS_BY_CP = {2: (512, 1024, 2048), 4: (512, 1024, 2048)}
MODELS = ("tiny", "tiny-gqa")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="compare these measured rows (JSONL) instead of measuring")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-cpu-splits.md"))
    ap.add_argument("--results-dir", default=str(REPO / "results"))
    args = ap.parse_args()
    import calibrate_cpu

    from hcp_tune.costmodel import agreement, calibrate
    from hcp_tune.costmodel.formulas import CostParams

    if args.rows:
        rows = calibrate.read_rows(args.rows)
    else:
        rows = []
        for model in MODELS:
            rows += calibrate_cpu.measure(REPO, Path(args.results_dir) / "cpu_splits_trials",
                                          SEQS_BY_CP, model)
        rows = [{**r, "env_tag": calibrate_cpu.ENV_TAG} for r in rows]
        (REPO / "benchmarks" / "cpu_splits_rows.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    ok = [r for r in rows if r["status"] == "ok" and r["median_s"]]
    cal_rows = [r for r in calibrate.read_rows(str(REPO / "benchmarks" / "calibrate_cpu_rows.jsonl"))
                if r["status"] == "ok"]
    params, rep = calibrate.fit(cal_rows, n_starts=6)
    out = ["# Split order on this CPU: cp=2 and cp=4, tiny and tiny-gqa\n",
           f"Measured {len(rows)} trials ({len(ok)} ok): attention runner, pure-torch reference, "
           f"fp32, gloo, one layer forward + backward, median of 5 steps after 1 warm-up, "
           f"seq by cp {SEQS_BY_CP}. Produced by `python benchmarks/cpu_splits.py`; rows in "
           "`benchmarks/cpu_splits_rows.jsonl`. Nothing here was fitted to these rows.\n"]
    for model in MODELS:
        mine = [r for r in ok if r["model"] == model]
        out.append(f"## {model}\n\n### Uncalibrated defaults\n\n"
                   + agreement.table(agreement.agreement(mine, CostParams())) + "\n")
        out.append(f"### Calibrated on `calibrate_cpu_rows.jsonl` (tiny, cp=4/8; rms "
                   f"{rep.rms_rel_error:.1%} there)\n\n"
                   + agreement.table(agreement.agreement(mine, params)) + "\n")
        errs = calibrate.fit_report(mine, params)
        out.append(f"Its time error on these rows: rms {errs.rms_rel_error:.1%}, max "
                   f"{errs.max_rel_error:.1%}.\n")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results

    write_results(args.out, "\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
