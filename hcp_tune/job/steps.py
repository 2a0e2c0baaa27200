"""Steps: a batch of trials run one after another in one allocation, each in fresh processes.

``executor.batch=steps`` (issue 10, 1b). The job's batch script runs ONE driver process
(``run_steps``: standard library only, no torch), which for each trial in order starts the
trial's ranks as a new process set, waits for them and goes on:

- on SLURM, one ``srun`` job step per trial (``srun_argv``): no new queue wait, fresh
  processes; with pyxis the step names its container ``hcp-tune-<job id>``, so the image
  is imported by the first step on each node and reused by the later ones;
- on the local executor, ``world_size`` processes on this machine, started with torchrun's
  variables (the same step entry, the same result files).

Every rank runs ``python -m hcp_tune.job.steps SPEC.json`` (``main``): one trial through
``entry.run_trials``, its result written to the spec's ``result_path`` (rank r > 0 beside
it) the moment it ends, as in a same-processes batch; the orchestrator polls those files.

A step that ends without rank 0's result gets a verdict here: ``time_limit`` when the
driver's per-trial limit (the runner's ``time_limit_s`` plus start-up) passed and it ended
the step, else the error line of the rank logs. A trial whose stop file (early stop,
Ctrl-C) exists before its step would start is not started: it ends PRUNED with the stop
file's text; a running trial sees its stop file through the job's own check.

What ends the batch: processes are fresh per step, so an OOM, a comm failure or a crash of
one step leaves the next step's processes sound, and the batch goes on. The allocation
itself is given up (the rest come back SKIPPED, "not run", for the orchestrator to
requeue in a new job) when a step's failure is ``environment`` (a node lost, a step SLURM
could not start, software missing: every later step would fail the same way) or when a
step outlived its kill (its processes may still hold the devices).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from hcp_tune.job.batch import run_trials, write_result
from hcp_tune.job.dist import quiet_ports
from hcp_tune.job.progress import stop_reason
from hcp_tune.merge import merge_root_cause, rank_out_path
from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    TrialSpec,
    atomic_write_text,
    classify_error_text,
    first_error_line,
    result_from_json,
    spec_from_json,
    to_json,
)

STARTUP_S = 120.0  # per step, on top of the runner's time limit: imports, rendezvous
GRACE_S = 15.0  # after the driver asked a step to end: time to end before it is killed
RANK0_DONE_GRACE_S = 5.0  # local: rank 0 is done, the others only add a root cause
POLL_S = 0.2  # how often the driver looks at a running step
CONTAINER_PREFIX = "hcp-tune-"  # pyxis: the allocation's named container, + the job id
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*")
# srun's own words for a step that could not run at all (not a task's failure)
_SRUN_BROKEN = ("node failure", "unable to create step", "step creation", "unable to launch",
                "nodes required for job are down", "pyxis: failed", "error: pyxis",
                "enroot")


@dataclass(frozen=True)
class StepLaunch:
    """How the driver starts a trial's ranks on SLURM (built by ``dispatch.step_launch``)."""

    nodes: int
    tasks_per_node: int
    python: str  # the interpreter the ranks run (inside the container when there is one)
    srun_args: tuple[str, ...] = ()  # executor.extra_srun
    container_image: Optional[str] = None  # pyxis
    container_mounts: tuple[str, ...] = field(default=())
    # GPUs each node's step asks for (the allocation's; 0 on a CPU profile): a step that asks
    # for none gets none on sites that do not hand a step the job's GPUs by default
    gpus_per_node: int = 0


def srun_argv(spec: TrialSpec, spec_file: Path, logs: Path, launch: StepLaunch, job_id: str,
              *, entry: str = "hcp_tune.job.steps", name: Optional[str] = None,
              args: tuple[str, ...] = ()) -> list[str]:
    """The ``srun`` that runs one trial as a job step of allocation ``job_id``.

    Every task's output goes to ``logs/rank<task>.log``. With a container image the step
    names the container ``hcp-tune-<job id>`` and passes the image too: pyxis uses an
    existing container of that name and skips the import, so the first step on a node
    creates it and the later ones reuse it (and a first step that failed before creating
    it does not strand the rest). ``--kill-on-bad-exit`` is not set: a rank that dies
    leaves its peers to fail on their own and write the comm verdict with its cause.
    ``entry``, ``name``, ``args``: another rank entry and its step's name (``job.pool``
    runs a batch of trials in one step: ``python -m hcp_tune.job.pool SPECS.json N JOB``).
    """
    argv = ["srun", f"--job-name={name or step_name(spec)}", f"--nodes={launch.nodes}",
            f"--ntasks={spec.world_size}", f"--ntasks-per-node={launch.tasks_per_node}",
            f"--output={logs / 'rank%t.log'}",
            # ranks fill one node after another, as the plan's groups assume (a site's
            # cyclic default would put an a2a group across nodes: bridge/placement.py);
            # a --distribution in executor.extra_srun comes later and wins
            "--distribution=block"]
    if launch.gpus_per_node:  # every task sees the node's GPUs; dist.bind_device picks its own
        argv.append(f"--gpus-per-node={launch.gpus_per_node}")
    if launch.container_image:
        argv += [f"--container-image={launch.container_image}",
                 f"--container-name={CONTAINER_PREFIX}{job_id}"]
        if launch.container_mounts:
            argv.append(f"--container-mounts={','.join(launch.container_mounts)}")
    argv += [*launch.srun_args, launch.python, "-u", "-m", entry, str(spec_file), *args]
    return argv


def step_name(spec: TrialSpec) -> str:
    """The job step's name: how the driver finds the step to cancel it."""
    return f"hcp-tune-step-{spec.trial_id}"


# ---------------------------------------------------------------- the driver


def run_steps(specs: list[TrialSpec], launch: Optional[StepLaunch], workdir: str | Path,
              *, startup_s: float = STARTUP_S) -> list[TrialResult]:
    """The batch job's one process: each trial as its own step (``launch``: SLURM's
    srun; None: local processes), in order; each result is in its ``result_path`` when its
    step ends. A step is ended past its runner's ``time_limit_s`` plus ``startup_s``.
    Returns every trial's result (SKIPPED: not run, the allocation was given up)."""
    workdir = Path(workdir).resolve()
    out: list[TrialResult] = []
    broken: Optional[TrialResult] = None
    for spec in specs:
        if broken is not None:
            res = TrialResult(
                trial_id=spec.trial_id, status=Status.SKIPPED, world_size=spec.world_size,
                error=f"not run: trial {broken.trial_id} left the allocation unusable")
            _write(spec, res)
        elif _landed(spec) is not None:  # this job ran it before SLURM restarted the job
            res = _landed(spec)
        elif stop_reason(spec) is not None:  # early stop or Ctrl-C before it started
            res = TrialResult(trial_id=spec.trial_id, status=Status.PRUNED,
                              world_size=spec.world_size, error=stop_reason(spec),
                              notes=["not started: its stop file was there before its step"])
            _write(spec, res)
        else:
            res, unusable = run_step(spec, launch, workdir / spec.trial_id, startup_s)
            if unusable:
                broken = res
        out.append(res)
    return out


def _landed(spec: TrialSpec) -> Optional[TrialResult]:
    """The trial's result when it is already there. The orchestrator removes a trial's
    result file before it submits the trial, so one that exists was written by this very
    job before SLURM requeued and restarted it: kept, never measured twice."""
    try:
        res = result_from_json(Path(spec.result_path).read_text()) if spec.result_path else None
    except (OSError, ValueError):
        return None
    return res if res is not None and res.status is not Status.SKIPPED else None


def run_step(spec: TrialSpec, launch: Optional[StepLaunch], folder: Path,
             startup_s: float = STARTUP_S) -> tuple[TrialResult, bool]:
    """One trial in fresh processes; (its result, whether the allocation is unusable now)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "spec.json"
    atomic_write_text(str(spec_file), to_json(spec))
    result = Path(spec.result_path) if spec.result_path else folder / "result.json"
    if not spec.result_path:
        spec = _with_result_path(spec, result, spec_file)
    for r in range(spec.world_size):
        rank_out_path(result, r).unlink(missing_ok=True)
    limit = spec.time_limit_s + startup_s
    if launch is None:
        timed_out, stuck, srun_log = _run_local(spec, spec_file, folder, limit), False, None
    else:
        srun_log = folder / "srun.log"
        timed_out, stuck = _run_srun(spec, spec_file, folder, launch, limit, srun_log)
    res = _verdict(spec, result, folder, timed_out, limit, startup_s, srun_log)
    unusable = stuck or res.failure_class is FailureClass.ENVIRONMENT
    if stuck:
        res.notes.append("the step outlived its kill: the rest of the batch goes to a new job")
        _write(spec, res)
    return res, unusable


def _with_result_path(spec: TrialSpec, result: Path, spec_file: Path) -> TrialSpec:
    spec = spec_from_json(to_json(spec))
    spec.result_path = str(result)
    atomic_write_text(str(spec_file), to_json(spec))
    return spec


def _write(spec: TrialSpec, res: TrialResult) -> None:
    if spec.result_path:
        atomic_write_text(spec.result_path, to_json(res))


def _verdict(spec: TrialSpec, result: Path, folder: Path, timed_out: bool, limit: float,
             startup_s: float, srun_log: Optional[Path]) -> TrialResult:
    """Rank 0's result with a peer's root cause merged in; else one built from the step."""
    logs = sorted(folder.glob("rank*.log"))
    try:
        res = merge_root_cause(result_from_json(result.read_text()), result, spec.world_size)
        res.log_path = res.log_path or str(folder / "rank0.log")
    except (OSError, ValueError):
        res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, world_size=spec.world_size,
                          log_path=str(folder / "rank0.log"))
        ranks_ran = any(p.stat().st_size for p in logs)
        srun_err = _srun_error(srun_log)
        if timed_out:
            res.failure_class = FailureClass.TIME_LIMIT
            res.error = (f"time limit: the step passed the driver's limit of {limit:.0f}s "
                         f"(runner time limit + {startup_s:.0f}s start-up) and was ended")
        elif srun_log is not None and not ranks_ran:  # SLURM could not start the step
            res.failure_class = FailureClass.ENVIRONMENT
            res.error = srun_err or _srun_said(srun_log) or "srun started none of the ranks"
            res.log_path = str(srun_log)
        else:
            err = next(filter(None, (_log_error(p) for p in logs)), None) or srun_err
            res.error = err or "rank 0 wrote no result and its processes left no error"
            res.failure_class = classify_error_text(res.error)
    atomic_write_text(str(result), to_json(res))  # what the orchestrator reads: merged once
    return res


def _log_error(log: Path) -> Optional[str]:
    """The last exception line of a rank's log (Python prints the cause last)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [ln.strip() for ln in lines if _ERROR_LINE.match(ln.strip())]
    return first_error_line(found[-1]) if found else None


def _srun_said(log: Path) -> Optional[str]:
    """srun's first own line (``srun: unrecognized option ...``), else its first line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    own = [ln for ln in lines if ln.startswith("srun:")]
    return first_error_line((own or lines)[0]) if lines else None


def _srun_error(log: Optional[Path]) -> Optional[str]:
    """srun's own error line saying the step could not run (a node lost, no step)."""
    if log is None:
        return None
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for ln in lines:
        if any(m in ln.lower() for m in _SRUN_BROKEN):
            return first_error_line(ln)
    return None


# ---------------------------------------------------------------- starting a step


def _wait(procs: list[subprocess.Popen], deadline: float,
          shorten: Callable[[float], float], poll_s: float = POLL_S) -> bool:
    """Poll until every process ended or the deadline (which ``shorten`` may bring
    forward) passed; True when it passed."""
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        deadline = shorten(deadline)
        if now > deadline:
            return True
        time.sleep(poll_s)  # polling cadence, not synchronisation
    return False


def _run_srun(spec: TrialSpec, spec_file: Path, folder: Path, launch: StepLaunch,
              limit: float, srun_log: Path, argv: Optional[list[str]] = None
              ) -> tuple[bool, bool]:
    """Run the trial as one srun step (``argv``: another step, from ``srun_argv``);
    (timed out, step outlived its kill)."""
    job_id = os.environ.get("SLURM_JOB_ID", "0")
    argv = argv or srun_argv(spec, spec_file, folder, launch, job_id)
    name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
    with open(srun_log, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        timed_out = _wait([proc], time.monotonic() + limit, lambda d: d)
        if not timed_out:
            return False, False
        proc.send_signal(signal.SIGTERM)  # srun forwards it to every task
        if not _wait([proc], time.monotonic() + GRACE_S, lambda d: d):
            return True, False
        _cancel_step(job_id, name)
        proc.kill()
        proc.wait()
        return True, True


def _cancel_step(job_id: str, name: str) -> None:
    """Cancel the job step named ``name`` of job ``job_id`` (found with ``squeue -s``)."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"],
                         capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        step, _, step_name_ = line.strip().partition("|")
        if step_name_ == name:
            subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, check=False)


def _run_local(spec: TrialSpec, spec_file: Path, folder: Path, limit: float) -> bool:
    """Run the trial as ``world_size`` local processes (torchrun's environment);
    True when the driver's limit ended it."""
    world = spec.world_size
    port = quiet_ports()  # below the ephemeral range, as a pool set's
    # torchrun's variables: the driver's own submitit ones (one task, rank 0) would make
    # every rank read itself as rank 0 of 1 (job.dist.detect_env prefers submitit's)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SUBMITIT_")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(world), HCP_TUNE_JOB_ID=f"local-{port}")
    root = str(Path(__file__).resolve().parents[2])  # the project, importable by the ranks
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [root, base.get("PYTHONPATH")]))
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    procs = []
    for r in range(world):
        log = folder / f"rank{r}.log"
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r), HCP_TUNE_LOG=str(log))
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-u", "-m", "hcp_tune.job.steps", str(spec_file)], stdout=fh,
                stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True))
    shortened = [False]

    def shorten(deadline: float) -> float:
        now = time.monotonic()
        if procs[0].poll() is not None:  # rank 0 is done: don't wait on a hung peer
            shortened[0] = True
            return min(deadline, now + RANK0_DONE_GRACE_S)
        if any(p.poll() not in (None, 0) for p in procs) and not shortened[0]:
            shortened[0] = True  # one died: the rest get the comm timeout to notice
            return min(deadline, now + spec.comm_timeout_s + GRACE_S)
        return deadline

    try:
        timed_out = _wait(procs, time.monotonic() + limit, shorten)
    finally:  # also when the job is cancelled: no rank outlives the driver
        _kill_all(procs)
    return timed_out and not shortened[0]


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the rank and children
            except ProcessLookupError:
                pass
        p.wait()


# ---------------------------------------------------------------- the step entry


def main(argv: Optional[list[str]] = None) -> int:
    """One rank of one step: ``python -m hcp_tune.job.steps SPEC.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hcp_tune.job.steps SPEC.json", file=sys.stderr)
        return 2
    spec = spec_from_json(Path(args[0]).read_text())
    from hcp_tune.job.dist import detect_env

    rank = detect_env().rank
    step = os.environ.get("SLURM_STEP_ID")
    where = (f"SLURM step {os.environ.get('SLURM_JOB_ID')}.{step}" if step is not None
             else "local processes")

    def write(res: TrialResult) -> None:
        res.notes.append(f"fresh processes: {where}, rank {rank} pid {os.getpid()}")
        res.log_path = res.log_path or str(Path(args[0]).parent / f"rank{rank}.log")
        write_result(res, Path(spec.result_path), rank)
        print(f"[rank {rank}] {res.trial_id}: {res.status.value}"
              + (f" ({res.failure_class.value}) {res.error}" if res.failure_class else ""),
              flush=True)

    results = run_trials([spec], on_result=write)
    if results[0].status == Status.FAILED:  # the group may be broken: skip the teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
