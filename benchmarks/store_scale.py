"""How the commands scale with the results folder: a nightly regression store of N trials.

Builds folders with ``store_gen.write_bulk`` (the sweep's own write path would take half
an hour per 100,000 trials; tests/store/test_store_gen.py shows the bulk folder equals the
real one) in two shapes, ``many`` (50 keys a night, 25 trials a key: N/25 keys) and ``few``
(25 keys a night over two nights: N/50 trials a key), and times, each in a fresh process
(wall clock from the process's start, peak resident memory from ``wait4``):

- ``open``: listing the ledger's studies (one line of each key's journal) and opening one
  key's study (optuna replays that key's journal, not the folder's);
- ``plan``: resume planning of the last night's sweep (``Sweeper.plan``: its keys' rows,
  their studies, the plan; nothing left to submit);
- ``submit``: a new night's sweep (the same keys under a new env tag) as ``hcp sweep``
  runs it with ``executor=slurm``: config, planning and the first job submitted to the
  local SLURM cluster, clocked from the command's start; the job is cancelled at once
  (needs ``sinfo`` to answer; left out with ``--ops``);
- ``rebuild_all``: deriving every key's rows and both tables from the studies (a bulk
  folder has no tables yet; the first update after a migration does this once);
- ``sweep24``: a new key's 24 trials through the write path (ask -> submitted -> row file ->
  tell) against the folder, per trial, then the end-of-sweep update (``ResultStore.rebuild``:
  only the keys that changed are derived again);
- ``recommend``, ``report env_tag=X``, ``report`` (every key), ``regress`` of two tags:
  the commands as a user runs them (``python -m hcp_tune ...``).

Not a test: it writes ``benchmarks/RESULTS-store-scale.md`` (stamped: command, date, commit,
machine, load average) and prints the same table.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/store_scale.py [--sizes 1000,20000]
        [--shapes many,few] [--ops open,plan,...] [--timeout-s 600] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
from stamp import write_results  # noqa: E402  the stamp block the docs read

import store_gen  # noqa: E402

OPS = ("open", "plan", "submit", "rebuild_all", "sweep24", "recommend", "report_tag",
       "report_all", "regress")
# issue 20's targets at 100,000 trials in 4,000 keys: (what, op, field, limit, unit)
TARGETS = (("planning and the first job submitted", "submit", "first_submit_s", 5.0, "s"),
           ("end-of-sweep update, 24-trial sweep", "sweep24", "rebuild_s", 2.0, "s"),
           ("`recommend`", "recommend", "wall_s", 1.0, "s"),
           ("`report env_tag=X`", "report_tag", "wall_s", 10.0, "s"),
           ("`regress` of two tags", "regress", "wall_s", 10.0, "s"),
           ("one trial's ledger cost", "sweep24", "per_trial_ms", 30.0, "ms"))
MEMORY_LIMIT_MB = 1024
SHAPES = ("many", "few")


def shape(name: str, n: int) -> tuple[int, int, int]:
    """(nights, keys a night, trials a key) for ``n`` trials: ``many``: 25 trials a key,
    up to 50 keys a night, at least two nights (regress compares two); ``few``: two nights
    of 25 keys, N/50 trials a key."""
    if name == "many":
        keys = max(2, n // 25)
        nights = max(2, -(-keys // 50))
        return nights, keys // nights, 25
    return 2, 25, max(1, n // 50)


# ------------------------------------------------------------------ in the child process
def child(op: str, root: Path, nights: int, keys_per_night: int) -> dict:
    t0 = time.perf_counter()
    out: dict = {}
    if op == "open":
        from hcp_tune.store.folder import ResultStore
        from hcp_tune.store.studies import Ledger

        ledger = Ledger(ResultStore(root).ledger())
        names = ledger.names()
        out["studies"] = len(names)
        t1 = time.perf_counter()
        out["trials_one_key"] = len(ledger.study(names[-1]).get_trials(deepcopy=False))
        out["one_key_s"] = time.perf_counter() - t1
    elif op == "plan":
        from sweep_overhead import Quiet

        from hcp_tune import config
        from hcp_tune.engine.sweep import Sweeper

        cfg = config.load([*store_gen.sweep_args(nights - 1, keys_per_night),
                           f"results_dir={root}", "executor=local"])
        t1 = time.perf_counter()
        plan = Sweeper(cfg, Quiet()).plan()
        out["plan_s"] = time.perf_counter() - t1
        out["keys"], out["queued"] = len(plan.kept), len(plan.queue)
    elif op == "submit":
        import dataclasses

        from sweep_overhead import Quiet

        from hcp_tune import config
        from hcp_tune.engine import dispatch
        from hcp_tune.engine.runner_choice import resolve_runner
        from hcp_tune.engine.sweep import Sweeper

        args = [a for a in store_gen.sweep_args(nights - 1, keys_per_night)
                if not a.startswith("env_tag=")]
        cfg = config.load([*args, "env_tag=nightly-submit", f"results_dir={root}",
                           "executor=slurm"])  # what cmd_sweep does, up to the first job
        runner, _ = resolve_runner(cfg.runner.name)
        config.writable_dir(cfg.results_dir)
        cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, name=runner))
        sweeper = Sweeper(cfg, Quiet())
        plan = sweeper.plan()
        sweeper.fill()
        out["first_submit_s"] = time.time() - float(os.environ["STORE_SCALE_T0"])
        out["keys"], out["jobs"] = len(plan.kept), len(sweeper.running)
        dispatch.cancel([r.handle for r in sweeper.running])
    elif op == "rebuild_all":
        from hcp_tune.store.folder import ResultStore

        ResultStore(root).rebuild()
    elif op == "sweep24":
        from hcp_tune.store.folder import ResultStore, SweepKey
        from hcp_tune.store.studies import LayoutStudy
        from hcp_tune.spec import Status

        key = SweepKey("local", "tiny", 1, store_gen.CP, 4096, "attention", "nightly-new")
        t1 = time.perf_counter()
        store = ResultStore(root)
        storage = store.ledger()
        study = LayoutStudy(storage, key.name, store_gen.kept_a2a(1))  # its journal only
        out["replay_s"] = time.perf_counter() - t1
        t1, c1 = time.perf_counter(), time.process_time()
        for number, a2a, row in store_gen.trials(key, 24):
            got, _, _ = study.ask(a2a, key.slug)
            study.submitted(got, row["job_id"], "slurm", store_gen.JOBS_FOLDER)
            store.add(row, key)
            study.tell(got, Status(row["status"]), None, row=row)
        out["per_trial_ms"] = (time.perf_counter() - t1) / 24 * 1000
        out["per_trial_cpu_ms"] = (time.process_time() - c1) / 24 * 1000
        t1 = time.perf_counter()
        store.rebuild(storage)
        out["rebuild_s"] = time.perf_counter() - t1
    out["in_process_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------ in the parent
def command(op: str, root: Path, nights: int, keys_per_night: int) -> list[str]:
    py = [sys.executable]
    if op in ("open", "plan", "submit", "rebuild_all", "sweep24"):
        return [*py, __file__, "--child", op, "--root", str(root), "--nights", str(nights),
                "--keys-per-night", str(keys_per_night)]
    hcp = [*py, "-m", "hcp_tune"]
    first = store_gen.key_of(0, 0)
    if op == "recommend":
        return [*hcp, "recommend", "cluster=local", "model=tiny", f"cp={first.cp}",
                f"tp={first.tp}", f"seq={first.seq}", f"env_tag={first.env_tag}",
                f"results_dir={root}"]
    if op == "report_tag":
        return [*hcp, "report", f"results_dir={root}", f"env_tag={first.env_tag}"]
    if op == "report_all":
        return [*hcp, "report", f"results_dir={root}"]
    return [*hcp, "regress", f"results_dir={root}", f"baseline={store_gen.night_tag(0)}",
            f"candidate={store_gen.night_tag(1)}"]


def timed(cmd: list[str], timeout_s: float) -> dict:
    """Wall seconds from the process's start, its peak RSS (MB), its exit code and, for a
    child op, what it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "STORE_SCALE_T0": repr(time.time())}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=REPO, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"wall_s": None, "timeout_s": timeout_s}
    wall = time.perf_counter() - t0
    out = {"wall_s": wall, "rc": proc.returncode}
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    if last.startswith("{"):
        out.update(json.loads(last))
    if proc.returncode not in (0, 1):
        out["error"] = (stderr.strip().splitlines() or ["?"])[-1][:200]
    return out


# The peak-memory wrapper, standard library only: run as this script (``--peak``) it would
# first import hcp_tune's engine and optuna (this script's imports), and that start-up
# would be counted in every command's wall time (about 0.4 s of `recommend`'s 1.2 s).
PEAK_WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
stdout, _ = proc.communicate()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
extra = json.loads(last) if last.startswith("{") else {}
print(json.dumps({**extra, "peak_mb": round(usage.ru_maxrss / 1024, 1),
                  "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}))
sys.exit(proc.returncode)
"""


def with_peak(cmd: list[str]) -> list[str]:
    """Run ``cmd`` under a wrapper (``PEAK_WRAPPER``) that reports its peak RSS: the
    wrapper's only child, so RUSAGE_CHILDREN's maximum is the command's own."""
    return [sys.executable, "-c", PEAK_WRAPPER, *cmd]


def du_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def run_size(shape_name: str, n: int, ops: list[str], timeout_s: float) -> dict:
    nights, kpn, per_key = shape(shape_name, n)
    key_list = store_gen.keys(nights, kpn)
    tmp = Path(tempfile.mkdtemp(prefix="hcp-store-scale-"))
    try:
        t0 = time.perf_counter()
        store_gen.write_bulk(tmp, key_list, per_key)
        res = {"shape": shape_name, "trials": len(key_list) * per_key, "keys": len(key_list),
               "tags": nights, "build_s": time.perf_counter() - t0}
        for op in ops:
            res[op] = timed(with_peak(command(op, tmp, nights, kpn)), timeout_s)
            print(f"  {shape_name} {res['trials']}: {op} {res[op]}", flush=True)
        res["size_mb"] = du_mb(tmp)
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fmt(r: dict, op: str) -> str:
    v = r.get(op)
    if not v:
        return "-"
    if v.get("wall_s") is None:
        return f"> {v['timeout_s']:.0f} s"
    bits = [f"{v['wall_s']:.1f} s"]
    if op == "sweep24" and "per_trial_ms" in v:
        bits = [f"open {v['replay_s']:.2f} s, {v['per_trial_ms']:.0f} ms/trial "
                f"(CPU {v.get('per_trial_cpu_ms', 0):.0f} ms), update {v['rebuild_s']:.2f} s"]
    if op == "plan" and "plan_s" in v:
        bits.append(f"(plan {v['plan_s']:.1f} s)")
    if op == "submit" and "first_submit_s" in v:
        bits = [f"first job {v['first_submit_s']:.1f} s"]
    if op == "open" and "one_key_s" in v:
        bits.append(f"(one key {v['one_key_s']:.2f} s)")
    if "peak_mb" in v:
        bits.append(f"{v['peak_mb']:.0f} MB")
    if "cpu_s" in v:
        bits.append(f"CPU {v['cpu_s']:.1f} s")
    if v.get("error"):
        bits.append(f"rc {v['rc']}: {v['error']}")
    return ", ".join(bits)


def table(results: list[dict], ops: list[str]) -> str:
    head = ["shape", "trials", "keys", "folder MB", "build s", *ops]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(results, key=lambda r: (r["shape"], r["trials"])):
        lines.append("| " + " | ".join([r["shape"], f"{r['trials']:,}", f"{r['keys']:,}",
                                        f"{r['size_mb']:.0f}", f"{r['build_s']:.1f}",
                                        *(fmt(r, op) for op in ops)]) + " |")
    return "\n".join(lines)


HEADER = """# Results folder scale (benchmarks/store_scale.py)

What each command costs as a nightly results folder grows (issue 20; the design, how to
reproduce and what is left: [docs/store-scale.md](../docs/store-scale.md)). Folders are
built in bulk by `benchmarks/store_gen.py` (a test shows they equal the sweep's own write
path's, byte for byte); each command runs in a fresh process, timed from its start
(imports included), with its peak resident memory. The machine is shared with other work:
the load averages are in the stamp (end of the run) and below (start); read the growth
along a column rather than one absolute figure.

Columns: `open` listing the ledger's studies (in brackets: opening one key's journal);
`plan` resume planning of the last night's sweep (in brackets `Sweeper.plan` itself);
`submit` a new night's sweep with `executor=slurm`, from the command's start to its first
job submitted to the local SLURM cluster (cancelled at once); `rebuild_all` deriving every
key's rows and tables from the studies (once per folder: a bulk folder has no tables);
`sweep24` a new key's 24 trials through the write path: opening its journal, the mean
ledger cost of one trial (ask, submitted, row file, tell) and the end-of-sweep update
(`ResultStore.rebuild`, only the changed keys derived); `recommend`, `report_tag`
(`report env_tag=nightly-0000`), `report_all` (`report`), `regress`
(`baseline=nightly-0000 candidate=nightly-0001`) as a user runs them. Each cell: wall
seconds, then peak resident memory. Shapes: `many` 25 trials a key, up to 50 keys a night;
`few` 2 nights × 25 keys, N/50 trials a key.
"""


TARGET_TRIALS = 100_000  # the size issue 20 sets its targets at


def targets(results: list[dict]) -> str:
    """Issue 20's targets at TARGET_TRIALS (when measured) and at the largest folder
    measured (the growth past it)."""
    sizes = [r for r in results if r["trials"] == TARGET_TRIALS][:1]
    if results:
        largest = max(results, key=lambda x: x["trials"])
        sizes += [largest] if largest not in sizes else []
    return "\n".join(targets_at(r, "the targets' size" if r["trials"] == TARGET_TRIALS
                                else "the largest folder measured") for r in sizes)


def targets_at(r: dict, which: str) -> str:
    lines = [f"## Targets at {which}: {r['trials']:,} trials in "
             f"{r['keys']:,} keys ({r['shape']})", "",
             "Measured: wall clock under the load above; in brackets the command's CPU "
             "seconds (user + system), which the other work on the machine does not "
             "stretch.", "",
             "| target | limit | measured | met |", "|---|---|---|---|"]
    for what, op, field, limit, unit in TARGETS:
        v = (r.get(op) or {}).get(field)
        got = "-" if v is None else f"{v:.2f} {unit}"
        if v is not None and field == "wall_s" and "cpu_s" in r[op]:
            got += f" ({r[op]['cpu_s']:.2f} s CPU)"
        met = "-" if v is None else ("yes" if v <= limit else "**no**")
        lines.append(f"| {what} | ≤ {limit:g} {unit} | {got} | {met} |")
    peaks = {op: v["peak_mb"] for op, v in r.items()
             if isinstance(v, dict) and isinstance(v.get("peak_mb"), (int, float))}
    if peaks:
        top = max(peaks, key=peaks.get)
        over = [f"`{op}` {mb:.0f} MB" for op, mb in sorted(peaks.items()) if mb > MEMORY_LIMIT_MB]
        lines.append(f"| no command above 1 GB | ≤ {MEMORY_LIMIT_MB} MB | largest: `{top}` "
                     f"{peaks[top]:.0f} MB{'; over: ' + ', '.join(over) if over else ''} | "
                     f"{'**no**' if over else 'yes'} |")
    return "\n".join(lines) + "\n"


def document(results: list[dict], ops: list[str], load_start) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (HEADER + f"\nMachine: {os.cpu_count()} cores ({cpu}), Python "
            f"{platform.python_version()}; load average at the start (1, 5, 15 min): "
            f"{' '.join(f'{x:.2f}' for x in load_start)}.\n\n" + targets(results)
            + "\n## Every size\n\n" + table(results, ops) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--out", default=str(HERE / "RESULTS-store-scale.md"))
    ap.add_argument("--child")
    ap.add_argument("--root")
    ap.add_argument("--nights", type=int)
    ap.add_argument("--keys-per-night", type=int)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, Path(a.root), a.nights, a.keys_per_night)))
        return
    ops = a.ops.split(",")
    load_start = tuple(round(x, 2) for x in os.getloadavg())
    results = []
    for shape_name in a.shapes.split(","):
        for n in map(int, a.sizes.split(",")):
            results.append(run_size(shape_name, n, ops, a.timeout_s))
            # written after each size: a run stopped part way keeps what it measured
            write_results(a.out, document(results, ops, load_start))
    print(table(results, ops))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
