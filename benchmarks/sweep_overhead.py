"""Sweep overhead: a whole ``python -m hcp_tune sweep`` command through the local SLURM
cluster, its wall time over the sum of the measured steps, and where the rest goes, phase
by phase (issue 39's configuration).

16 CPU trials of cp=2 (model tiny, seq 256..2048, both layouts), 1 warm-up and 3 measured
steps, ``executor=slurm``: ``search.adaptive=false search.repeats=1`` (one trial a layout,
``exhaustive``), the adaptive default (``adaptive``: rounds until each key is settled, a
tie or out of trials, in the kept allocation), and the same with
``executor.keep_allocation=false`` (``adaptive-job-per-round``: a new job per round, as
before the kept allocation). The command runs as a user runs it, a fresh process, so the
orchestrator's own start-up (the interpreter, its imports, Hydra) is counted.

Phases, from the command's output (each line's arrival time), the kept allocation's
driver (``trials/*.pool/timeline.jsonl``) and the trials' rows (rank 0's ``phases_s``, the
result files' times, the process set in each result's notes): the orchestrator's start
(spawn to its first line: imports, config, plan, the ledger); submission and queueing (to
the job's start); the driver's imports (once per allocation); the first process set's
launch; each process set's world group (and, in a job without a driver, its ranks'
imports); the trials' group set-up and CP proof; their warm-up steps; the measured steps
(the ratio's denominator); the measured phase besides the steps; between trials inside a
process set; between process sets (a set's end noticed, its results stored, the next
round decided, handed over and started: what adaptive rounds pay); the tail (the last
result to the command's exit: the set's end, polling, storing, tables, the allocation's
release).

Needs the local cluster (``scripts/slurm-local.sh start``). Not a test: it writes
benchmarks/RESULTS-sweep-overhead.md (stamped).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_overhead.py [--modes exhaustive,...]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from stamp import write_results  # noqa: E402

from hcp_tune.store.records import ROW_FILES  # noqa: E402

SEQS = [256, 512, 768, 1024, 1280, 1536, 1792, 2048]
ARGS = ["cp=2", f"seq=[{','.join(map(str, SEQS))}]", "model=tiny", "cluster=local",
        "runner=attention", "runner.warmup_steps=1", "runner.measure_steps=3",
        "executor=slurm"]
MODES = {"exhaustive": ["search.adaptive=false", "search.repeats=1"], "adaptive": [],
         # the adaptive default as it ran before the kept allocation: a new job per round
         "adaptive-job-per-round": ["executor.keep_allocation=false"]}
TARGET = 1.5
RESULTS = HERE / "RESULTS-sweep-overhead.md"
SET_NOTE = re.compile(r"process set (\d+) of allocation")  # job/pool.py's note on a result


class Quiet:
    """A reporter that prints only the trial count (sweep_engine.py and store_scale.py
    drive the Sweeper in-process with it)."""

    def start(self, total, summary):
        print(f"{total} trials", flush=True)

    def trial(self, spec, status, detail, best=None):
        pass

    def stop(self):
        pass


def run(mode: str) -> dict:
    """One sweep command, timed; its output lines with their arrival times and its rows."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COLUMNS": "200",
           "PYTHONUNBUFFERED": "1"}  # each line as it is printed: its time is the phase edge
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hcp_tune", "sweep", *ARGS, *MODES[mode],
               f"results_dir={tmp}"]
        began = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=REPO, env=env)
        lines = [(time.time(), line.rstrip("\n")) for line in proc.stdout]
        proc.wait()
        ended = time.time()
        if proc.returncode:
            sys.exit(f"{mode}: the sweep exited {proc.returncode}:\n"
                     + "\n".join(x for _, x in lines[-20:]))
        trials = []
        for p in Path(tmp, "rows").glob(f"*/{ROW_FILES}"):
            r = json.loads(p.read_text())
            result = Path(tmp, "trials", f"{r['trial_id']}.result.json")
            notes = json.loads(result.read_text()).get("notes", []) if result.exists() else []
            sets = [m.group(1) for m in map(SET_NOTE.search, notes) if m]
            trials.append({"status": r["status"], "wall_s": r["wall_s"] or 0.0,
                           "job": (r["job_id"], sets[0] if sets else None),
                           "steps": json.loads(r["step_times_s"] or "[]"),
                           "phases": json.loads(r.get("phases_s") or "{}"),
                           "written": result.stat().st_mtime if result.exists() else ended})
        drivers = []  # each kept allocation's driver: {event: time}
        for timeline in Path(tmp, "trials").glob("*.pool/timeline.jsonl"):
            events = [json.loads(x) for x in timeline.read_text().splitlines()]
            drivers.append({e["event"]: e["t"] for e in events})
    return {"began": began, "ended": ended, "lines": lines, "trials": trials,
            "drivers": sorted(drivers, key=lambda d: d["start"])}


def phases(got: dict) -> tuple[float, float, list[tuple[str, float]]]:
    """(wall, measured steps, [(phase, seconds)]): the phases add up to the wall. A process
    set's first trial's ``wall_s`` includes its imports and world group (rank 0's clock);
    a kept allocation's driver imports once, before its first set (its timeline)."""
    trials = sorted(got["trials"], key=lambda t: t["written"])
    ok = [t for t in trials if t["status"] == "ok"]
    wall = got["ended"] - got["began"]
    steps = sum(sum(t["steps"]) for t in ok)
    first_line = got["lines"][0][0] if got["lines"] else got["ended"]
    spans = []  # per job, or process set of a kept allocation: first trial's start to last result
    for job in dict.fromkeys(t["job"] for t in trials):
        mine = [t for t in trials if t["job"] == job]
        spans.append((mine[0]["written"] - mine[0]["wall_s"], mine[-1]["written"]))
    spans.sort()

    def total(*names: str) -> float:
        return sum(t["phases"].get(n, 0.0) for t in trials for n in names)

    firsts = sum("between" not in t["phases"] for t in trials)
    all_steps = sum(sum(t["steps"]) for t in trials)
    known = total("imports", "start", "groups", "proof", "warmup", "measure")
    walls = sum(t["wall_s"] for t in trials)
    inside = sum(b - a for a, b in spans)
    driver = got["drivers"][0] if got["drivers"] else {}
    started = driver.get("start", spans[0][0])  # the job's process: the pool's driver
    warm = driver.get("warm", started)  # its imports done (it forks the ranks)
    out = [
        ("orchestrator start (interpreter, imports, config, plan, ledger)",
         first_line - got["began"]),
        ("submission and queueing (to the job's start)", started - first_line),
        (f"allocation start: the driver's imports, once ({len(got['drivers'])} "
         "allocation(s))", warm - started),
        ("first process set's launch (its ranks forked or started)", spans[0][0] - warm),
        (f"ranks' start: imports and world group ({firsts} process set(s))",
         total("imports", "start")),
        ("trials: group set-up and CP proof", total("groups", "proof")),
        ("trials: warm-up steps", total("warmup")),
        ("measured steps", steps),
        ("measured phase besides the steps (and failed trials' steps)",
         total("measure") - all_steps + (all_steps - steps)),
        ("trials' own rest (results, group teardown)", walls - known),
        ("between trials inside a process set (result writes, the next spec)",
         inside - walls),
        (f"between process sets ({len(spans) - 1} gap(s): a set's end noticed, its results "
         "stored, the next round decided, handed over and started)",
         sum(b[0] - a[1] for a, b in zip(spans, spans[1:]))),
        ("tail (last result to exit: job end, polling, storing, tables)",
         got["ended"] - spans[-1][1]),
    ]
    return wall, steps, out


def ratio(got: dict) -> float:
    wall, steps, _ = phases(got)
    return wall / steps


def all_steps_ratio(got: dict) -> float:
    """Wall over every step the trials ran, warm-up included: what the engine adds on top
    of what a trial is (the warm-up is part of the trial's protocol, not overhead)."""
    wall, steps, parts = phases(got)
    return wall / (steps + dict(parts)["trials: warm-up steps"])


def report(mode: str, got: dict) -> str:
    wall, steps, parts = phases(got)
    ok = sum(t["status"] == "ok" for t in got["trials"])
    jobs = len({t["job"][0] for t in got["trials"]})
    sets = len({t["job"] for t in got["trials"]})
    head = (f"{mode}: {ok}/{len(got['trials'])} trials ok in {jobs} job(s), {sets} process "
            f"set(s); sweep wall "
            f"{wall:.1f} s, measured steps {steps:.1f} s, ratio {wall / steps:.2f}x "
            f"(target <= {TARGET}x); over all the trials' steps, warm-up included, "
            f"{all_steps_ratio(got):.2f}x")
    rows = [f"  {name}: {s:.1f} s ({s / wall:.0%})" for name, s in parts]
    rows.append(f"  (the phases add up to {sum(s for _, s in parts):.1f} s; overlapping jobs "
                "would count twice)")
    return "\n".join([head, *rows])


HEADER = """# Sweep overhead: a sweep command's wall time over its measured steps

Written by `benchmarks/sweep_overhead.py`: {doc}

```bash
scripts/slurm-local.sh start
PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_overhead.py
```

Machine: see the stamp (a shared 2-core box without a GPU: CPU timings are noisy and the
load is recorded; compare the lines of one run).

How to read it. A sweep keeps its allocation (`executor.keep_allocation`, the default;
docs/guides/sweeps.md, "A kept allocation"): one job per world size, whose driver imports
torch and Megatron-Core once and forks a fresh process set for each batch (an adaptive
round, a repeat), so a round costs a fork and a world group where it cost a new job (a
submission, a queue wait, the imports in every rank). That is what the adaptive default
gains: `adaptive` against `adaptive-job-per-round` (`executor.keep_allocation=false`, as
every sweep ran before) in the same run, and against the earlier commit's run quoted at
the end. The target (issue 39: wall <= 1.5x the measured steps) is not reached on this
box, and the breakdown says why it cannot be here: the warm-up step of each trial is part
of what a trial measures (1 warm-up for 3 measured steps is 1.33x before anything else;
measured, 1.35-1.37x), and what is left, 0.17x, is less than a fresh process's imports of
torch alone (2 s here) over the exhaustive sweep's 6-7 s of measured steps. Over all the
steps the trials run (the bracketed ratio), the adaptive default is about 1.3x. The
driver imports torch and Megatron-Core's ``parallel_state`` alone (``job/mcore.py``: the
whole package's ``__init__`` imports its models, optimizer and TE extension), 2 s once per
allocation where the whole package took 3-4 s (4-6 s under load). The exhaustive
sweep is one batch, so it pays them as before (one process imports where both ranks
imported at once: half the CPU, the same wall on 2 idle cores). What the orchestrator adds
(its start, the gaps between rounds, the tail) is 1-3 s in all, and the local cluster's
submission and queueing 0.5-3 s, the most variable phase. Left as it is:
the orchestrator spends about 0.1 s of CPU per stored trial (the ledger's journal writes,
the best layout's interval) and a squeue call per second, beside the trials on the same 2
cores. On GPUs the steps are longer, and a kept allocation saves a queue wait and a
container start per round besides the imports.

## Output of the stamped runs
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--runs", type=int, default=1,
                    help="run the modes this many times (noisy CPU timings: every run shown)")
    ap.add_argument("--before", default=None,
                    help="an earlier results file of this script (another commit) to quote "
                         "after this run, stamp included, for a before/after comparison")
    args = ap.parse_args()
    buf = io.StringIO()
    ratios: dict[str, list[str]] = {}
    for n in range(1, args.runs + 1):
        print(f"run {n} of {args.runs}; load average at start: {os.getloadavg()}, cores: "
              f"{os.cpu_count()}", file=buf)
        for mode in args.modes.split(","):
            got = run(mode)
            ratios.setdefault(mode, []).append(
                f"{ratio(got):.2f}x ({all_steps_ratio(got):.2f}x of all steps)")
            text = report(mode, got)
            print(text, flush=True)
            print(text, file=buf)
    doc = " ".join(__doc__.split("\n\n")[1].split())
    summary = "; ".join(f"{mode} {', '.join(r)}" for mode, r in ratios.items())
    text = (HEADER.format(doc=doc) + f"\nWall over the measured steps, run by run, and in "
            f"brackets over all the trials' steps (warm-up included): {summary} "
            f"(target <= {TARGET}x, over the measured steps).\n\n```text\n"
            + buf.getvalue() + "```\n")
    if args.before:
        earlier = Path(args.before).read_text()
        stamp_end = earlier.index("-->") + 3
        text += ("\n## The run it is compared with\n\nThe same script on an earlier commit, "
                 "its stamp:\n\n```text\n" + earlier[:stamp_end].strip("<!-> \n") + "\n```\n\n"
                 + earlier[earlier.index("```text"):])
    write_results(args.out, text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
