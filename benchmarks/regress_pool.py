"""Record the pool of trials that ``benchmarks/regress_error_rates.py`` resamples: one code
version measured many times on this machine, in several sessions, plus sessions with an
injected delay (a known slowdown of the ring layout only).

The workload is the A/A scenario of issue 23: ``cluster=local model=tiny cp=2 seq=1024
runner=attention executor=local`` with the runner's default steps (2 warm-up, 5 measured).
Each session is one ``sweep`` under its own env tag, ``search.repeats=R`` (8; 10 for the
last), early stopping off, ``executor.trials_per_job=8`` (a fresh process set every 8
trials):

    pool-1 delay-1 pool-2 pool-3 delay-2 pool-4 bigdelay-1   (so load drift spreads)

``delay-*`` run with ``HCP_TUNE_INJECT_DELAY=p2p:0.005``: 5 ms before each of the ring's
transfers of ``[1,2]`` (some +15% on a ~0.13 s step), ``bigdelay-1`` with ``p2p:0.05``
(several-fold); ``[2,1]`` (pure a2a) is untouched by either. The stored rows go to
``benchmarks/regress_pool_rows.jsonl`` (one JSON row per line, the store's own format).
A session already stored is resumed (nothing measured again), so sessions can be added.

    PYTHONPATH=$PWD python benchmarks/regress_pool.py [--results-dir DIR]

Measured here: 6 to 7 minutes per session of 16 trials at a load average of 14-23 on the
2 shared cores (the other engineers' test runs), some 50 minutes for the pool.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = REPO / "benchmarks" / "regress_pool_rows.jsonl"
WORKLOAD = ("cluster=local", "model=tiny", "cp=2", "seq=1024", "runner=attention",
            "executor=local", "search.early_stop=false", "executor.trials_per_job=8")
SESSIONS = {  # env tag -> (HCP_TUNE_INJECT_DELAY or None, search.repeats)
    "pool-1": (None, 8), "delay-1": ("p2p:0.005", 8), "pool-2": (None, 8),
    "pool-3": (None, 8), "delay-2": ("p2p:0.005", 8), "pool-4": (None, 8),
    "bigdelay-1": ("p2p:0.05", 10),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", default="/tmp/hcp-regress-pool")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from hcp_tune.store.folder import ResultStore

    results = Path(args.results_dir)
    env = {k: v for k, v in os.environ.items() if k != "HCP_TUNE_INJECT_DELAY"}
    env["PYTHONPATH"] = str(REPO)
    for tag, (delay, repeats) in SESSIONS.items():
        t0 = time.monotonic()
        run_env = {**env, "HCP_TUNE_INJECT_DELAY": delay} if delay else env
        r = subprocess.run(
            [sys.executable, "-m", "hcp_tune", "sweep", *WORKLOAD, f"env_tag={tag}",
             f"search.repeats={repeats}", f"results_dir={results}"],
            capture_output=True, text=True, cwd=REPO, env=run_env)
        print(f"{tag}: exit {r.returncode} in {time.monotonic() - t0:.0f} s, load "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
            return 1
    rows = [r for r in ResultStore(results).rows() if r.get("env_tag") in SESSIONS]
    rows.sort(key=lambda r: (list(SESSIONS).index(r["env_tag"]), r["trial_id"]))
    ROWS.write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {ROWS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
