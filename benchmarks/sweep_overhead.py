"""Sweep overhead: wall time of a real sweep through the local SLURM cluster divided by the
ideal, i.e. the trials' own durations (``TrialResult.wall_s``, start-up included) packed
into the available slots (longest-first greedy packing, a lower bound within 4/3).

Needs the local cluster (``scripts/slurm-local.sh start``). Not a test: it prints numbers.

    .venv/bin/python benchmarks/sweep_overhead.py [--seqs 8]
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hcp_tune import config  # noqa: E402
from hcp_tune.engine.sweep import Sweeper  # noqa: E402


class Quiet:
    def start(self, total, summary):
        print(f"{total} trials", flush=True)

    def trial(self, spec, status, detail, best=None):
        pass

    def stop(self):
        pass


def packed_makespan(durations: list[float], slots: int) -> float:
    finish = [0.0] * slots
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(finish, finish[0] + d)
        heapq.heapify(finish)
    return max(finish)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, default=8)
    args = ap.parse_args()
    seqs = [256 * (i + 1) for i in range(args.seqs)]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.load([
            "cp=2", f"seq=[{','.join(map(str, seqs))}]", "model=tiny", "cluster=local",
            "executor=slurm", "runner=attention",  # the Sweeper measures: no runner=auto
            "runner.warmup_steps=1", "runner.measure_steps=3", "search.early_stop=false",
            f"results_dir={tmp}",
        ])
        t0 = time.monotonic()
        Sweeper(cfg, Quiet()).run()
        wall = time.monotonic() - t0
        rows = [json.loads(p.read_text()) for p in Path(tmp, "rows").glob("*/*.json")]
    durations = [r["wall_s"] for r in rows if r.get("wall_s")]
    statuses = sorted({r["status"] for r in rows})
    print(f"trial statuses: {statuses}; trial wall_s is rank 0's run_trial (after the "
          "imports), so the ratio also counts process start-up and imports in the job")
    if statuses != ["ok"]:  # failed trials are fast: their times would flatter the sweep
        errors = sorted({r["error"] for r in rows if r["status"] != "ok"})
        sys.exit(f"not every trial is ok, no overhead figure: {errors}")
    slots = 1  # the local profile is a CPU profile: the sweep runs one trial at a time
    ideal = packed_makespan(durations, slots)
    print("| trials | slots | sweep wall s | sum of trial wall s | ideal packed s | overhead |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(rows)} | {slots} | {wall:.1f} | {sum(durations):.1f} | {ideal:.1f} | "
          f"{wall / ideal:.2f}x |")


if __name__ == "__main__":
    main()
