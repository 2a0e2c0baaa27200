"""A kept allocation (``executor.keep_allocation``): one driver process per job runs batches
of trials one after another, each batch in a fresh process set, and takes each next batch
from a file the orchestrator writes into the pool's folder. An adaptive sweep's next round,
or the trials a broken batch never ran, then start without a new submission, queue wait or
container start.

The folder (``PoolFiles``; the orchestrator's ``engine/pools.py`` uses the same names):

- ``batch-<n>.json``: the specs of process set n (set 0's come with the job itself);
- ``batch-<n>/rank<r>.log``: its ranks' output;
- ``batch-<n>.done.json``: written when set n's processes ended: their exit codes, start
  and end times, and the error when they did not all end well;
- ``end``: the orchestrator has no more work for this allocation; the driver returns;
- ``timeline.jsonl``: when the driver started and when its imports were done.

A process set is started (``start_set``):

- forked from the driver, which imported torch, Megatron-Core and the trial's modules once
  (``warm``): CPU trials on one node without a container. A set then costs a fork and a
  world group, where an interpreter and its imports in every rank cost more than the tiny
  trials' steps. Forking from a process that imported torch is what the DataLoader's
  workers do; nothing of CUDA exists in the driver (it never forks for GPU trials, whose
  driver imports nothing). Each forked rank is a fresh process: its own world group,
  groups, CP proof and warm-up, as in a new job;
- otherwise as new interpreters: local processes with torchrun's variables (as ``steps``
  starts a trial), or on SLURM one srun job step over the allocation
  (``steps.srun_argv``); each rank runs ``python -m hcp_tune.job.pool SPECS.json N JOB``.

What a set's ranks do is ``batch.run_batch``, as in a job of one process set: trials in
order, each result written the moment it ends, the rest SKIPPED after a FAILED one.

The driver ends when the ``end`` file appears; when, waiting for a batch, it finds its
sweep's marker gone (``owner``: ``sweeps/<host>-<pid>-*.running``, which the sweep removes
when it ends and a resumed sweep removes when its process died); after ``POOL_IDLE_S``
without a next batch (a dead sweep on another host leaves its marker); or when a set
outlived its kill (its processes may still hold the devices: the sweep submits a new job).
On SIGTERM (scancel, SLURM's time limit, preemption: the job is ending) it ends the set's
processes and exits with neither a done file nor a result, so the sweep reads the job's
own verdict (``cancelled``, ``time_limit``) for that set's trials, as for a job of one
process set. A driver that
SLURM requeued and restarted skips the sets whose done file is there: nothing runs twice.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hcp_tune.job.steps import (
    GRACE_S,
    RANK0_DONE_GRACE_S,
    STARTUP_S,
    StepLaunch,
    _kill_all,
    _log_error,
    _run_srun,
    _wait,
    srun_argv,
)
from hcp_tune.job.mcore import parallel_state
from hcp_tune.merge import rank_out_path
from hcp_tune.spec import Status, TrialResult, TrialSpec, atomic_write_text, spec_from_json, to_json

POOL_IDLE_S = 60.0  # a driver left this long without a next batch or an end returns
POLL_S = 0.05  # how often the driver looks at its ranks and for its next batch (cheap)
# what a forked rank would import first: torch, Megatron-Core's groups, the trial's modules
WARM = ("torch", "torch.distributed", "hcp_tune.job.trial",
        "hcp_tune.job.bench", "hcp_tune.job.attention.verify",
        "hcp_tune.job.attention.reference", "hcp_tune.job.dist", "hcp_tune.job.groups")


@dataclass(frozen=True)
class PoolFiles:
    """Every name in a pool's folder (both sides use these)."""

    root: Path

    def batch(self, n: int) -> Path:
        return self.root / f"batch-{n}.json"

    def logs(self, n: int) -> Path:
        return self.root / f"batch-{n}"

    def done(self, n: int) -> Path:
        return self.root / f"batch-{n}.done.json"

    @property
    def end(self) -> Path:
        return self.root / "end"

    @property
    def timeline(self) -> Path:
        return self.root / "timeline.jsonl"

    def event(self, name: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.timeline, "a") as f:
            f.write(json.dumps({"event": name, "t": time.time()}) + "\n")


def write_specs(path: Path, specs: list[TrialSpec]) -> None:
    """A batch file: the specs as one JSON list (atomic: the driver never reads half)."""
    atomic_write_text(str(path), json.dumps([json.loads(to_json(s)) for s in specs]))


def read_specs(path: Path) -> list[TrialSpec]:
    return [spec_from_json(json.dumps(d)) for d in json.loads(Path(path).read_text())]


def read_done(path: Path) -> Optional[dict]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the driver


def run_pool(first: list[TrialSpec], root: str | Path, launch: Optional[StepLaunch] = None,
             fork: bool = False, owner: str = "", *, idle_s: float = POOL_IDLE_S,
             startup_s: float = STARTUP_S) -> list[TrialResult]:
    """The job's one process: set 0 runs ``first``, set n the specs of ``batch-<n>.json``,
    until ``end`` (see the module docstring). ``launch``: SLURM's srun steps; None: local
    processes. ``fork``: start each set by fork from this process once it imported what
    the trials import (the orchestrator asks for it on one CPU node, no container).
    ``owner``: the sweep's marker file; once it is gone no batch will come.
    Returns every trial's result that was written."""
    files = PoolFiles(Path(root).resolve())
    files.event("start")
    job = _job_id()
    if threading.current_thread() is threading.main_thread():  # (submitit's ignores it)
        signal.signal(signal.SIGTERM, _ending)
    ran: list[TrialSpec] = []
    try:
        if fork:
            fork = warm()
            files.event("warm")
        n, specs = 0, list(first)
        while specs:
            if files.done(n).exists():  # this job ran it before SLURM restarted the job
                done = read_done(files.done(n)) or {}
            else:
                done = run_set(specs, files, n, launch, fork, job, startup_s)
                atomic_write_text(str(files.done(n)), json.dumps(done))
            ran += specs
            if done.get("unusable"):
                break
            n += 1
            specs = wait_for_batch(files, n, idle_s, owner)
    except Ending:  # the set's processes are ended (run_set's finally): no done file, and
        files.event("sigterm")  # no result of the job: SLURM's state is its verdict
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
    files.event("end")
    return [r for r in map(_result, ran) if r is not None]


class Ending(BaseException):
    """SIGTERM reached the driver: its job is ending (scancel, time limit, preemption)."""


def _ending(signum, frame) -> None:
    raise Ending()


def _job_id() -> str:
    return (os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
            or str(os.getpid()))


def _result(spec: TrialSpec) -> Optional[TrialResult]:
    from hcp_tune.spec import result_from_json

    try:
        return result_from_json(Path(spec.result_path).read_text()) if spec.result_path else None
    except (OSError, ValueError):
        return None


def warm() -> bool:
    """Import what a forked rank needs (``WARM``); True when forking is safe: torch is
    there and CUDA is not initialised. A module that fails to import is left to the ranks,
    whose trial reports it."""
    try:
        for name in WARM:
            importlib.import_module(name)
        parallel_state()  # Megatron-Core's groups module alone, as a rank imports it
    except Exception:  # noqa: BLE001 - the ranks import it again and say what failed
        pass
    torch = sys.modules.get("torch")
    return torch is not None and not torch.cuda.is_initialized()


def wait_for_batch(files: PoolFiles, n: int, idle_s: float, owner: str = ""
                   ) -> Optional[list[TrialSpec]]:
    """Set n's specs once the orchestrator wrote them; None at ``end``, once the ``owner``
    marker is gone, or after ``idle_s``."""
    deadline = time.monotonic() + idle_s
    while time.monotonic() < deadline:
        if files.batch(n).exists():
            return read_specs(files.batch(n))
        if files.end.exists() or (owner and not os.path.exists(owner)):
            return None
        time.sleep(POLL_S)  # the driver's polling cadence, not synchronisation
    return None


def run_set(specs: list[TrialSpec], files: PoolFiles, n: int, launch: Optional[StepLaunch],
            fork: bool, job: str, startup_s: float = STARTUP_S) -> dict:
    """Process set n: start its ranks, wait for them (at most the trials' time limits plus
    ``startup_s``; a hung peer of an ended rank 0 is ended after a grace), and say how
    they ended."""
    folder = files.logs(n)
    folder.mkdir(parents=True, exist_ok=True)
    world = specs[0].world_size
    for s in specs:  # a peer's file of an earlier attempt must not pass for this one's
        for r in range(1, world):
            if s.result_path:
                rank_out_path(Path(s.result_path), r).unlink(missing_ok=True)
    spec_file = folder / "specs.json"
    write_specs(spec_file, specs)
    limit = sum(s.time_limit_s for s in specs) + startup_s
    comm = max(s.comm_timeout_s for s in specs)
    started = time.time()
    stuck, mode = False, "fork" if fork else "srun" if launch is not None else "local"
    if launch is not None and not fork:
        argv = srun_argv(specs[0], spec_file, folder, launch, job, entry="hcp_tune.job.pool",
                         name=f"hcp-tune-set-{n}", args=(str(n), job))
        timed_out, stuck = _run_srun(specs[0], spec_file, folder, launch, limit,
                                     folder / "srun.log", argv=argv)
        codes: list[Optional[int]] = []
    else:
        procs = (_fork_ranks(specs, folder, n, job) if fork
                 else _exec_ranks(spec_file, folder, world, n, job))
        try:
            timed_out = _wait(procs, time.monotonic() + limit, _shorten(procs, comm), POLL_S)
        finally:  # also when the job is cancelled: no rank outlives the driver
            _kill_all(procs)
        codes = [p.returncode for p in procs]
    error = None
    if timed_out:
        error = (f"time limit: process set {n} passed the driver's limit of {limit:.0f}s "
                 f"(the trials' time limits + {startup_s:.0f}s start-up) and was ended")
    elif any(codes) or (not codes and not _all_written(specs)):
        logs = sorted(folder.glob("rank*.log"))
        error = (next(filter(None, (_log_error(p) for p in logs)), None)
                 or f"process set {n} ended with exit codes {codes or 'unknown'}")
    return {"n": n, "mode": mode, "started": started, "ended": time.time(), "codes": codes,
            "timed_out": timed_out, "unusable": stuck, "error": error,
            "log": str(folder / "rank0.log")}


def _all_written(specs: list[TrialSpec]) -> bool:
    return all(s.result_path and Path(s.result_path).exists() for s in specs)


def _shorten(procs: list, comm_timeout_s: float):
    """The deadline, brought forward: rank 0 is done (the rest only add a root cause), or
    one rank died (the rest get the comm timeout to notice)."""
    shortened = [False]

    def shorten(deadline: float) -> float:
        now = time.monotonic()
        if procs[0].poll() is not None and not shortened[0]:
            shortened[0] = True
            return min(deadline, now + RANK0_DONE_GRACE_S)
        if any(p.poll() not in (None, 0) for p in procs) and not shortened[0]:
            shortened[0] = True
            return min(deadline, now + comm_timeout_s + GRACE_S)
        return deadline

    return shorten


# ---------------------------------------------------------------- starting a set


def _rank_env(rank: int, world: int, port: int, job: str) -> dict[str, str]:
    """torchrun's variables for one rank of a set on this node; the driver's own submitit
    ones would make every rank read itself as the job's task 0 (``dist.detect_env``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBMITIT_")}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_RUN_ID=job)
    return env


class _Forked:
    """A forked rank, as much of ``subprocess.Popen`` as ``steps._wait``/``_kill_all`` use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> Optional[int]:
        if self.returncode is None:
            try:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:
                self.returncode = -1
        return self.returncode


def set_port(job: str, n: int) -> int:
    """Set n's rendezvous port: derived from the job and the set (the next set: another
    port), below the ephemeral range, the first from there that binds (``quiet_ports``)."""
    from hcp_tune.job.dist import JOB_PORT_BASE, job_port, quiet_ports

    return quiet_ports(job_port(job) - JOB_PORT_BASE + 997 * (n + 1))


def _fork_ranks(specs: list[TrialSpec], folder: Path, n: int, job: str) -> list[_Forked]:
    world, port, parent = specs[0].world_size, set_port(job, n), os.getpid()
    procs = []
    for rank in range(world):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _forked_rank(specs, rank, _rank_env(rank, world, port, job), folder, n, job, parent)
        try:  # the child does the same: whichever runs first, its group exists at once
            os.setpgid(pid, pid)
        except OSError:
            pass
        procs.append(_Forked(pid))
    return procs


def _forked_rank(specs: list[TrialSpec], rank: int, env: dict[str, str], folder: Path,
                 n: int, job: str, parent: int) -> None:
    """A forked rank: its own process group, gone with the driver, default signals, its
    output to its log, torchrun's variables; it runs the set's trials and exits."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent(parent)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)  # submitit's handlers are the driver's
        log = folder / f"rank{rank}.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        code = rank_main(specs, n, job, str(log))
    except BaseException:  # noqa: BLE001 - a forked child must never return to the driver
        sys.excepthook(*sys.exc_info())  # the traceback, to the rank's log
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _die_with_parent(parent: int) -> None:
    """End this rank once the driver is gone (killed, or the job ended), so no rank
    outlives it: its parent then is another process."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S * 10)  # the watcher's cadence
        os._exit(1)

    threading.Thread(target=watch, name="hcp-tune-driver-watch", daemon=True).start()


def _exec_ranks(spec_file: Path, folder: Path, world: int, n: int, job: str
                ) -> list[subprocess.Popen]:
    """The set as ``world`` new local interpreters (each its own session)."""
    port = set_port(job, n)
    root = str(Path(__file__).resolve().parents[2])  # the project, importable by the ranks
    procs = []
    for rank in range(world):
        env = _rank_env(rank, world, port, job)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
        with open(folder / f"rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-u", "-m", "hcp_tune.job.pool", str(spec_file), str(n), job],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder,
                start_new_session=True))
    return procs


# ---------------------------------------------------------------- a rank


def rank_main(specs: list[TrialSpec], n: int, job: str, log: str) -> int:
    """One rank of process set n: the set's trials (``batch.run_batch``); 1 when one FAILED."""
    from hcp_tune.job.batch import run_batch

    note = f"fresh processes: process set {n} of allocation {job}, pid {os.getpid()}"
    results = run_batch(specs, note=note, log_path=log)
    return 1 if any(r.status == Status.FAILED for r in results) else 0


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m hcp_tune.job.pool SPECS.json N JOB``: one rank of a set, started as a new
    interpreter (local processes or an srun step)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m hcp_tune.job.pool SPECS.json N JOB", file=sys.stderr)
        return 2
    from hcp_tune.job.dist import detect_env

    spec_file = Path(args[0])
    rank = detect_env().rank
    code = rank_main(read_specs(spec_file), int(args[1]), args[2],
                     str(spec_file.parent / f"rank{rank}.log"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # after a failure the group may be broken: no teardown wait


if __name__ == "__main__":
    sys.exit(main())
