"""Sweep engine, three ways on the same workloads through the local SLURM cluster:

- ``batched``: hcp-tune's engine, ``executor.trials_per_job=N`` (a workload in one job);
- ``one-per-job``: hcp-tune with ``trials_per_job=1`` (every trial its own job);
- ``hydra``: a user's own glue, hydra-submitit-launcher's ``--multirun`` over (seq, a2a),
  one SLURM job per point running ``hcp_tune trial`` (``benchmarks/hydra_baseline/``, in
  its own virtual environment ``benchmarks/.venv-hydra``, created here when missing).

Workloads: the 16-trial one (cp=2, model=tiny, seq 256..2048, both layouts) and a cp=4 one
(seq 512..2048: [1,4], [2,2], [4,1]); 1 warm-up + 3 measured steps, early stopping off;
``--smoke``: cp=2, seq 256 and 512 (4 trials). Per mode it prints the sweep's wall time,
the sum of its measured steps and their ratio; per trial, medians of the job's phases
(``phases_s``: imports, start = world group and fingerprint, groups, proof, warm-up,
measure, between = the previous trial's teardown and result write in the same
processes); the time outside every trial, split into head (submission, queue, job start
before the first trial), gaps between jobs and tail (the last result written to the sweep
returning: polling, job end, storing); the median cost outside measured steps of trials
inside a batch, with and without the warm-up; and whether each mode's winners agree with
one-per-job's where neither calls a tie (margin within both trials' p10-p90 noise).

Needs the local cluster (``scripts/slurm-local.sh start``). Not a test: it prints numbers.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_engine.py \\
        [--workloads cp2,cp4] [--modes batched,one-per-job,hydra] [--per-job 16] [--smoke]
        [--poll-s SECONDS]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from stamp import write_results  # noqa: E402
from sweep_overhead import Quiet  # noqa: E402  (the silent reporter; benchmarks/ is on the path)

from hcp_tune import config  # noqa: E402
from hcp_tune.engine import sweep  # noqa: E402
from hcp_tune.engine.sweep import Sweeper  # noqa: E402
from hcp_tune.noise import row_noise  # noqa: E402
from hcp_tune.space.plan import candidates  # noqa: E402
from hcp_tune.store.records import ROW_FILES  # noqa: E402

WORKLOADS = {
    "cp2": (2, [256, 512, 768, 1024, 1280, 1536, 1792, 2048]),
    "cp4": (4, [512, 1024, 2048]),
    "smoke": (2, [256, 512]),
}
COMMON = ["model=tiny", "cluster=local", "runner=attention", "runner.warmup_steps=1",
          "runner.measure_steps=3"]
MODES = ("batched", "one-per-job", "hydra")
PHASES = ("imports", "start", "groups", "proof", "warmup", "measure", "between")
HYDRA_VENV = HERE / ".venv-hydra"
HYDRA_PACKAGES = ["hydra-core==1.3.8", "hydra-submitit-launcher==1.2.0"]


def workload_args(name: str) -> list[str]:
    cp, seqs = WORKLOADS[name]
    return [f"cp={cp}", f"seq=[{','.join(map(str, seqs))}]", *COMMON]


def run_engine(name: str, per_job: int) -> dict:
    """hcp-tune's own sweep, ``trials_per_job=per_job``."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.load([*workload_args(name), "executor=slurm", "search.early_stop=false",
                           f"executor.trials_per_job={per_job}", f"results_dir={tmp}"])
        began = time.time()
        Sweeper(cfg, Quiet()).run()
        ended = time.time()
        trials = []
        for p in Path(tmp, "rows").glob(f"*/{ROW_FILES}"):
            r = json.loads(p.read_text())
            written = Path(tmp, "trials", f"{r['trial_id']}.result.json").stat().st_mtime
            trials.append({
                "seq": r["seq"], "a2a": r["a2a"], "status": r["status"], "job": r["job_id"],
                "steps": json.loads(r["step_times_s"] or "[]"), "wall_s": r["wall_s"] or 0.0,
                "phases": json.loads(r.get("phases_s") or "{}"), "written": written,
                "median_s": r["median_s"], "p10_s": r["p10_s"], "p90_s": r["p90_s"]})
        # when each job's processes handed their results back to submitit (job end)
        job_ends = [p.stat().st_mtime for p in Path(tmp, "jobs").glob("*/*_result.pkl")]
    return {"began": began, "ended": ended, "trials": trials, "job_ends": job_ends}


def hydra_python() -> Path:
    """The baseline's own interpreter; the venv is made (from the registry) when missing."""
    py = HYDRA_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run(["python3", "-m", "venv", str(HYDRA_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HYDRA_PACKAGES], check=True)
    return py


def run_hydra(name: str) -> dict:
    """hydra-submitit-launcher ``--multirun``: one SLURM job per (seq, a2a) point."""
    cp, seqs = WORKLOADS[name]
    cfg = config.load(workload_args(name))
    kept = {(c.seq, c.layout.a2a) for c in candidates(cfg) if c.kept}
    a2as = sorted({a for _, a in kept})
    if kept != {(s, a) for s in seqs for a in a2as}:
        raise SystemExit(f"{name}: the kept layouts are not a (seq x a2a) grid: {sorted(kept)}")
    py = hydra_python()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(py), str(HERE / "hydra_baseline" / "app.py"), "--multirun",
               f"cp={cp}", f"seq={','.join(map(str, seqs))}", f"a2a={','.join(map(str, a2as))}",
               f"python={sys.executable}", f"hydra.sweep.dir={tmp}"]
        began = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        ended = time.time()
        if r.returncode:
            raise SystemExit(f"hydra multirun exited {r.returncode}:\n{r.stderr[-3000:]}")
        trials = []
        for seq, a2a in sorted(kept):
            out = Path(tmp, f"seq{seq}-a{a2a}", "trial.json")
            res = json.loads(out.read_text())
            trials.append({
                "seq": seq, "a2a": a2a, "status": res["status"], "job": f"seq{seq}-a{a2a}",
                "steps": res["step_times_s"], "wall_s": res["wall_s"] or 0.0,
                "phases": res["phases_s"], "written": out.stat().st_mtime,
                "median_s": res["median_s"], "p10_s": res["p10_s"], "p90_s": res["p90_s"]})
        # one SLURM job per point (tasks of a job array): a folder <array>_<task> each
        jobs = len([p for p in Path(tmp, ".submitit").iterdir() if p.is_dir() and "_" in p.name])
    return {"began": began, "ended": ended, "trials": trials, "jobs": jobs}


def winners(trials: list[dict]) -> dict[int, tuple[int, bool]]:
    """Per seq: the fastest ok layout's a2a, and whether the runner-up is within the noise
    (the recommendation table's rule: margin <= the larger p10-p90 band of the two)."""
    out = {}
    for seq in sorted({t["seq"] for t in trials}):
        ranked = sorted((t for t in trials if t["seq"] == seq and t["status"] == "ok"),
                        key=lambda t: t["median_s"])
        if not ranked:
            continue
        best = ranked[0]
        tie = len(ranked) > 1 and (ranked[1]["median_s"] / best["median_s"] - 1
                                   <= max(row_noise(best), row_noise(ranked[1])))
        out[seq] = (best["a2a"], tie)
    return out


def med(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def report(name: str, mode: str, got: dict) -> None:
    trials = sorted(got["trials"], key=lambda t: t["written"])
    ok = [t for t in trials if t["status"] == "ok"]
    steps = sum(sum(t["steps"]) for t in ok)
    wall = got["ended"] - got["began"]
    jobs = got.get("jobs") or len({t["job"] for t in trials})
    print(f"{name} {mode}: {len(ok)}/{len(trials)} ok in {jobs} job(s); sweep wall {wall:.1f} s, "
          f"measured steps {steps:.1f} s, ratio {wall / steps:.2f}x" if steps else
          f"{name} {mode}: nothing measured", flush=True)
    if not ok:
        return
    print("  median per trial (s): " + ", ".join(
        f"{p} {med(t['phases'].get(p, 0.0) for t in ok):.3f}" for p in PHASES)
        + f", trial wall {med(t['wall_s'] for t in ok):.3f}")
    firsts = [t for t in trials if "between" not in t["phases"]]  # each job's first trial
    print(f"  each job's first trial: imports {sum(t['phases'].get('imports', 0.0) for t in firsts):.1f} s, "
          f"world group and fingerprint {sum(t['phases'].get('start', 0.0) for t in firsts):.1f} s "
          f"over {len(firsts)} job(s); measured-phase time besides the steps (the agreed-stop "
          f"all-reduce and progress line per step) median "
          f"{med(t['phases'].get('measure', 0.0) - sum(t['steps']) for t in ok):.3f} s")
    # a job's span: its first trial's start (result written minus wall) to its last result
    spans = []
    for job in dict.fromkeys(t["job"] for t in trials):
        mine = [t for t in trials if t["job"] == job]
        spans.append((mine[0]["written"] - mine[0]["wall_s"], mine[-1]["written"]))
    spans.sort()
    head, tail = spans[0][0] - got["began"], got["ended"] - spans[-1][1]
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    outside = head + sum(gaps) + tail
    print(f"  outside the jobs' trials: {outside:.1f} s ({outside / len(trials):.2f} s per trial) "
          f"= head {head:.1f} s (submit, queue, job start up to the first trial's imports) + "
          f"{len(gaps)} gap(s) between jobs {sum(gaps):.1f} s (median {med(gaps):.2f} s: a job's "
          f"end noticed, the next submitted, queued, started) + tail {tail:.1f} s (the last "
          f"result written to the sweep's return: polling, job end, storing)")
    if got.get("job_ends"):
        last_end = max(got["job_ends"])
        print(f"  the tail: the last job's teardown and exit {last_end - spans[-1][1]:.1f} s "
              f"(last result to its submitit result file), then the orchestrator "
              f"{got['ended'] - last_end:.1f} s (polling every {sweep.POLL_INTERVAL_S} s, "
              f"reading, storing, rebuilding the tables)")
    within = sum(b - a for a, b in spans) - sum(t["wall_s"] for t in trials)
    print(f"  inside the jobs, between trials (teardown, result writes): {within:.3f} s")
    inner = [t for t in ok if "between" in t["phases"]]  # not a job's first trial
    if inner:
        cost = [t["wall_s"] + t["phases"]["between"] - sum(t["steps"]) for t in inner]
        no_warm = [c - t["phases"].get("warmup", 0.0) for c, t in zip(cost, inner)]
        print(f"  inside a batch ({len(inner)} trial(s), not a job's first): median cost outside "
              f"the measured steps {med(cost):.3f} s; without the warm-up step "
              f"{med(no_warm):.3f} s")


def agreement(name: str, ref: dict, mode: str, other: dict) -> None:
    a, b = winners(ref["trials"]), winners(other["trials"])
    clear = [s for s in a if s in b and not a[s][1] and not b[s][1]]
    agree = [s for s in clear if a[s][0] == b[s][0]]
    print(f"{name}: {mode} vs one-per-job: winners agree on {len(agree)}/{len(clear)} key(s) "
          f"where neither calls a tie ({len(a)} keys ranked); disagree at seq "
          f"{sorted(set(clear) - set(agree)) or 'none'}")


RESULTS = HERE / "RESULTS-sweep-engine.md"
HEADER = """# Sweep engine: batched vs one job per trial vs a user's hydra-submitit-launcher glue

Written by `benchmarks/sweep_engine.py` (a full run; `--smoke` only prints): the local
one-node SLURM cluster (`scripts/slurm-local.sh start`), model tiny, 1 warm-up + 3 measured
steps per trial, early stopping off, `OMP_NUM_THREADS=1` in every mode (so the modes run the
same thread count and differ only in overheads). Machine: 2 cores, no GPU, shared with
other work: the stamp above records the load; compare the modes of one run, not runs.

Workloads: cp2 (seq 256..2048, both layouts: 16 trials) and cp4 (seq 512..2048, [1,4], [2,2],
[4,1]: 9 trials). Modes: `batched` (`executor.trials_per_job=16`: a workload in one job),
`one-per-job` (`trials_per_job=1`) and `hydra` (`benchmarks/hydra_baseline/`:
hydra-submitit-launcher's `--multirun` over (seq, a2a), one SLURM job per point running
`python -m hcp_tune trial`; its own venv `benchmarks/.venv-hydra`, made on the first run).

How to read a mode's lines: `ratio` is the sweep's wall time over the sum of its measured
steps (1.0 would be no overhead at all); `imports` and `world group and fingerprint` are what
every new job pays once; `outside the jobs' trials` is submission, queueing and job start
(head), the gaps between jobs, and the orchestrator's tail; `inside a batch` is what a
trial costs besides its measured steps when it shares processes with the trials before it.
The last lines say whether each mode's winner agrees with one-per-job's on the keys where
neither calls a tie (a margin within both trials' p10-p90 noise). CPU timings are noisy:
a disagreement at a small seq is a near tie, not an engine effect.

To reproduce (about 12 minutes on a quiet machine):

```bash
scripts/slurm-local.sh start
PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_engine.py
```

## Output of the stamped run
"""


class Tee:
    """Standard output that is also kept, for the results file."""

    def __init__(self, stream) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="cp2,cp4")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, any of {', '.join(MODES)}")
    ap.add_argument("--per-job", type=int, default=16, help="trials_per_job of 'batched'")
    ap.add_argument("--poll-s", type=float, default=None,
                    help=f"the orchestrator's polling interval for the hcp-tune modes "
                         f"(default: sweep.POLL_INTERVAL_S = {sweep.POLL_INTERVAL_S})")
    ap.add_argument("--smoke", action="store_true",
                    help="a quick check: workload cp=2, seq 256 and 512 (4 trials)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {unknown}; choices: {', '.join(MODES)}")
    workloads = ["smoke"] if args.smoke else args.workloads.split(",")
    tee = sys.stdout = Tee(sys.stdout)
    # hcp-tune's SLURM jobs leave a CPU rank's torch threads unbounded (every core each),
    # the local launcher behind `hcp_tune trial` gives a rank cores // ranks (here 1): without
    # one setting for all, the modes would measure different thread counts, not overheads
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.poll_s is not None:
        sweep.POLL_INTERVAL_S = args.poll_s  # read by Sweeper.run at every poll
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}; modes {modes}; "
          f"orchestrator polling every {sweep.POLL_INTERVAL_S} s; "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}", flush=True)
    for name in workloads:
        results = {}
        for mode in modes:
            if mode == "hydra":
                results[mode] = run_hydra(name)
            else:
                results[mode] = run_engine(name, args.per_job if mode == "batched" else 1)
            report(name, mode, results[mode])
        if "one-per-job" in results:
            for mode in results:
                if mode != "one-per-job":
                    agreement(name, results["one-per-job"], mode, results[mode])
    print(f"load average at end: {os.getloadavg()}")
    if not args.smoke:
        write_results(RESULTS, HEADER + "\n```text\n" + "".join(tee.parts) + "```\n")
        sys.stdout = tee.stream
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
