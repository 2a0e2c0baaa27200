"""Sweep engine: the batched engine (``executor.trials_per_job=N``) against one job per
trial (``trials_per_job=1``), on the same workloads through the local SLURM cluster.

Workloads: the 16-trial one (cp=2, model=tiny, seq 256..2048, both layouts) and a cp=4 one
(seq 512..2048: [1,4], [2,2], [4,1]); 1 warm-up + 3 measured steps, early stopping off.
Per mode it prints the sweep's wall time, the sum of its measured steps, their ratio, a
per-trial breakdown from each trial's ``phases_s`` (start: imports and world group, paid
by a job's first trial; groups; proof; warm-up; measured; the rest is bookkeeping) and the
median per-trial cost outside the measured steps of trials inside a batch (not a job's
first), and whether the winners agree where neither mode calls a tie.

Needs the local cluster (``scripts/slurm-local.sh start``). Not a test: it prints numbers.

    .venv/bin/python benchmarks/sweep_engine.py [--workloads cp2,cp4] [--per-job 16] [--batched-only]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hcp_tune import config  # noqa: E402
from hcp_tune.sweep import Sweeper  # noqa: E402
from sweep_overhead import Quiet  # noqa: E402  (the silent reporter; benchmarks/ is on the path)

WORKLOADS = {
    "cp2": ["cp=2", "seq=[256,512,768,1024,1280,1536,1792,2048]"],
    "cp4": ["cp=4", "seq=[512,1024,2048]"],
}
PHASES = ("start", "groups", "proof", "warmup", "measure")


def run(workload: list[str], per_job: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.load([
            *workload, "model=tiny", "cluster=local", "executor=slurm", "runner=attention",
            "runner.warmup_steps=1", "runner.measure_steps=3", "search.early_stop=false",
            f"executor.trials_per_job={per_job}", f"results_dir={tmp}",
        ])
        t0 = time.monotonic()
        summary = Sweeper(cfg, Quiet()).run()
        wall = time.monotonic() - t0
        rows = [json.loads(p.read_text()) for p in Path(tmp, "rows").glob("*/*.json")]
    recs = {(r["seq"]): r for r in summary.recommendations}
    return {"wall": wall, "rows": rows, "recs": recs}


def report(name: str, per_job: int, got: dict) -> None:
    rows = got["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    steps = sum(sum(json.loads(r["step_times_s"])) for r in ok)
    phases = [json.loads(r.get("phases_s") or "{}") for r in ok]
    jobs = len({r["job_id"] for r in rows})
    print(f"{name} trials_per_job={per_job}: {len(ok)}/{len(rows)} ok in {jobs} job(s); "
          f"sweep wall {got['wall']:.1f} s, measured steps {steps:.1f} s, "
          f"ratio {got['wall'] / steps:.2f}x")
    med = {p: statistics.median(ph.get(p, 0.0) for ph in phases) for p in PHASES}
    walls = [r["wall_s"] for r in ok]
    print("  median per trial (s): " + ", ".join(f"{p} {med[p]:.3f}" for p in PHASES)
          + f", trial wall {statistics.median(walls):.3f}")
    outside_job = got["wall"] - sum(walls)
    print(f"  outside the trials (job start-up, imports before the first trial, SLURM, "
          f"orchestrator polling and storing): {outside_job:.1f} s, "
          f"{outside_job / len(rows):.2f} s per trial")
    inner = [r["wall_s"] - sum(json.loads(r["step_times_s"])) for r, ph in zip(ok, phases)
             if ph.get("start", 0.0) < 0.5]  # not a job's first trial: no imports, no world
    if inner:
        print(f"  inside a batch (not a job's first trial): median cost outside the measured "
              f"steps {statistics.median(inner):.3f} s over {len(inner)} trial(s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="cp2,cp4")
    ap.add_argument("--per-job", type=int, default=16)
    ap.add_argument("--batched-only", action="store_true",
                    help="skip the trials_per_job=1 runs (a quick second sample)")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}")
    for name in args.workloads.split(","):
        results = {}
        for per_job in (args.per_job,) if args.batched_only else (args.per_job, 1):
            results[per_job] = run(WORKLOADS[name], per_job)
            report(name, per_job, results[per_job])
        if args.batched_only:
            continue
        a, b = results[args.per_job]["recs"], results[1]["recs"]
        clear = [s for s in a if s in b and not a[s]["tie"] and not b[s]["tie"]]
        agree = [s for s in clear if (a[s]["a2a"], a[s]["p2p"]) == (b[s]["a2a"], b[s]["p2p"])]
        print(f"{name}: winners agree on {len(agree)}/{len(clear)} key(s) where neither mode "
              f"calls a tie ({len(a)} keys ranked); disagree at seq "
              f"{sorted(set(clear) - set(agree)) or 'none'}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
