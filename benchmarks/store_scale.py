"""How the commands scale with the results folder: a nightly regression store of N trials.

Builds folders with ``store_gen.write_bulk`` (the sweep's own write path would take half
an hour per 100,000 trials; tests/engine/test_store_gen.py shows the bulk folder equals the
real one) in two shapes, ``many`` (50 keys a night, 25 trials a key: N/25 keys) and ``few``
(25 keys a night over two nights: N/50 trials a key), and times, each in a fresh process
(wall clock from the process's start, peak resident memory from ``wait4``):

- ``open``: opening the ledger (``Ledger.names``: optuna replays the whole journal);
- ``plan``: resume planning of the last night's sweep (``Sweeper.plan``: its keys' rows,
  their studies, the plan); the first submission is not included (no SLURM here);
- ``sweep24``: a new key's 24 trials through the write path (ask -> submitted -> row file ->
  tell) against the folder, per trial, then the end-of-sweep update (``ResultStore.rebuild``);
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

OPS = ("open", "plan", "sweep24", "recommend", "report_tag", "report_all", "regress")
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
        from hcp_tune.engine.tuner import Ledger

        out["studies"] = len(Ledger(root / "optuna.journal").names())
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
    elif op == "sweep24":
        from hcp_tune.engine.store import ResultStore, SweepKey
        from hcp_tune.engine.tuner import LayoutStudy, open_storage
        from hcp_tune.spec import Status

        key = SweepKey("local", "tiny", 1, store_gen.CP, 4096, "attention", "nightly-new")
        t1 = time.perf_counter()
        storage = open_storage(root / "optuna.journal")  # replays the journal
        study = LayoutStudy(storage, key.name, store_gen.kept_a2a(1))
        out["replay_s"] = time.perf_counter() - t1
        store = ResultStore(root)
        t1 = time.perf_counter()
        for number, a2a, row in store_gen.trials(key, 24):
            got, _, _ = study.ask(a2a, key.slug)
            study.submitted(got, row["job_id"], "slurm", store_gen.JOBS_FOLDER)
            store.add(row, key)
            study.tell(got, Status(row["status"]), None, row=row)
        out["per_trial_ms"] = (time.perf_counter() - t1) / 24 * 1000
        t1 = time.perf_counter()
        store.rebuild(storage)
        out["rebuild_s"] = time.perf_counter() - t1
    out["in_process_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------ in the parent
def command(op: str, root: Path, nights: int, keys_per_night: int) -> list[str]:
    py = [sys.executable]
    if op in ("open", "plan", "sweep24"):
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
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


def with_peak(cmd: list[str]) -> list[str]:
    """Run ``cmd`` under this script's ``--peak`` wrapper, which reports its peak RSS."""
    return [sys.executable, __file__, "--peak", "--", *cmd]


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


def peak_wrapper(cmd: list[str]) -> int:
    """Run ``cmd``, then print what it printed last (a child op's JSON) with its peak
    resident memory: this wrapper's only child, so RUSAGE_CHILDREN's maximum is its own."""
    import resource

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    stdout, _ = proc.communicate()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    extra = json.loads(last) if last.startswith("{") else {}
    print(json.dumps({**extra, "peak_mb": round(peak, 1)}))
    return proc.returncode


def fmt(r: dict, op: str) -> str:
    v = r.get(op)
    if not v:
        return "-"
    if v.get("wall_s") is None:
        return f"> {v['timeout_s']:.0f} s"
    bits = [f"{v['wall_s']:.1f} s"]
    if op == "sweep24" and "per_trial_ms" in v:
        bits = [f"replay {v['replay_s']:.1f} s, {v['per_trial_ms']:.0f} ms/trial, "
                f"update {v['rebuild_s']:.1f} s"]
    if op == "plan" and "plan_s" in v:
        bits.append(f"(plan {v['plan_s']:.1f} s)")
    if "peak_mb" in v:
        bits.append(f"{v['peak_mb']:.0f} MB")
    if v.get("error"):
        bits.append(f"rc {v['rc']}: {v['error']}")
    return ", ".join(bits)


def table(results: list[dict], ops: list[str]) -> str:
    head = ["shape", "trials", "keys", "folder MB", "build s", *ops]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        lines.append("| " + " | ".join([r["shape"], f"{r['trials']:,}", f"{r['keys']:,}",
                                        f"{r['size_mb']:.0f}", f"{r['build_s']:.1f}",
                                        *(fmt(r, op) for op in ops)]) + " |")
    return "\n".join(lines)


def stamp(argv: list[str], load_start, load_end) -> str:
    # run from an exported copy (``git archive``), the commit comes in HCP_TUNE_COMMIT
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() \
        or os.environ.get("HCP_TUNE_COMMIT", "unknown")
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"- command: `python benchmarks/store_scale.py {' '.join(argv)}`\n"
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
            f"- git commit: {commit}{' (with uncommitted changes)' if dirty else ''}\n"
            f"- machine: {platform.node()}, {os.cpu_count()} cores ({cpu}), "
            f"Python {platform.python_version()}\n"
            f"- load average (1, 5, 15 min): start {load_start}, end {load_end}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--out", default=str(HERE / "RESULTS-store-scale.md"))
    ap.add_argument("--child")
    ap.add_argument("--peak", action="store_true")
    ap.add_argument("--root")
    ap.add_argument("--nights", type=int)
    ap.add_argument("--keys-per-night", type=int)
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.peak:
        sys.exit(peak_wrapper(a.rest))
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
            load_end = tuple(round(x, 2) for x in os.getloadavg())
            text = table(results, ops)
            write_results(a.out, "# Results folder scale (benchmarks/store_scale.py)\n\n"
                          + stamp(sys.argv[1:], load_start, load_end) + "\n" + text)
    print(table(results, ops))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
