"""Dispatch: turn a call into a SLURM or local job, and a job back into data.

What belongs here: building, from the typed ``executor`` group (settings.ExecutorConfig), a
submitit executor for one trial shape, submission (single jobs and arrays), re-attaching a
job by its saved id, polling a job into a state plus its result or error *as data*,
cancelling, and where a job's logs are. This is the only module that imports submitit.

What does not: what a job runs. ``fn`` is any picklable callable (the trial runner takes a
``TrialSpec`` and returns a ``TrialResult``); in a multi-task job every task runs it and the
result of task 0 is the job's result. Nothing here raises because a *job* failed: a
failure is a ``JobOutcome`` with the error's meaningful line and the log paths.

Job state comes from the result files submitit writes, then from ``squeue`` (which knows a
finished job for ``MinJobAge`` seconds), then from ``sacct`` where accounting exists.
submitit's own watcher asks only ``sacct``, which a cluster without slurmdbd lacks.
"""
from __future__ import annotations

import contextlib
import enum
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import submitit
from submitit.core.utils import JobPaths

from hcp_tune.config.settings import EXECUTOR_NAMES, ExecutorConfig  # the executor group, typed
from hcp_tune.errors import ConfigError, one_line
from hcp_tune.engine.slurm_probe import cannot_host, partition_nodes  # moved there
from hcp_tune.job.steps import StepLaunch  # what a steps batch's driver is handed

# re-exported: callers build the executor from here, and read sinfo's partitions
__all__ = ["EXECUTOR_NAMES", "ExecutorConfig", "cannot_host", "partition_nodes"]

def resolve_executor_name(name: str) -> str:
    """``auto`` becomes ``slurm`` when ``sbatch`` is on PATH, else ``local``."""
    if name not in EXECUTOR_NAMES:
        raise ConfigError(f"executor.name={name!r}: expected {' | '.join(EXECUTOR_NAMES)}")
    if name != "auto":
        return name
    return "slurm" if shutil.which("sbatch") else "local"


def make_executor(
    cfg: ExecutorConfig,
    *,
    world_size: int,
    gpus_per_node: int,
    folder: Optional[str | Path] = None,
    tasks_per_node: Optional[int] = None,
) -> submitit.core.core.Executor:
    """A submitit executor for jobs of ``world_size`` ranks on nodes of ``gpus_per_node`` GPUs.

    SLURM: ``ceil(world_size / gpus_per_node)`` nodes of ``min(world_size, gpus_per_node)``
    tasks. Local: one node of ``world_size`` tasks, one process per rank as on SLURM (the
    sweep's trials run the same payload on both); its GPUs are the first ``gpus_per_node``
    of those CUDA_VISIBLE_DEVICES already allows (submitit would renumber them from 0).
    ``gpus_per_node=0``: no GPUs (a CPU profile).
    """
    if world_size < 1:
        raise ConfigError(f"world_size={world_size}: expected an integer >= 1")
    if gpus_per_node < 0:
        raise ConfigError(f"gpus_per_node={gpus_per_node}: expected an integer >= 0")
    name = resolve_executor_name(cfg.name)
    if folder is None and cfg.folder is None:
        raise ConfigError("executor.folder=null: give make_executor a folder (the sweep uses "
                          "<results_dir>/jobs)")
    root = Path(folder if folder is not None else cfg.folder)
    job_folder = root / "%j"
    signal_delay_s = min(90, max(10, cfg.time_limit_min * 60 // 5))  # USR2 before the limit
    per_node = gpus_per_node if gpus_per_node > 0 else world_size
    if name == "local":
        if world_size > per_node:
            raise ConfigError(
                f"world_size={world_size} > gpus_per_node={gpus_per_node}: the local executor runs"
                " one node; use executor=slurm or a smaller layout"
            )
        ex = submitit.LocalExecutor(folder=job_folder, python=cfg.python)
        gpus = gpus_per_node if cfg.gpus_per_node is None else cfg.gpus_per_node
        allowed = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        visible = [int(g) for g in allowed.split(",")] if re.fullmatch(r"\d+(,\d+)*", allowed) else []
        ex.update_parameters(
            timeout_min=cfg.time_limit_min,
            tasks_per_node=tasks_per_node or world_size,
            gpus_per_node=gpus,
            signal_delay_s=signal_delay_s,
            setup=list(cfg.setup),
            **({"visible_gpus": visible} if len(visible) >= gpus > 0 else {}),
        )
        return ex
    if world_size > per_node and world_size % per_node:
        raise ConfigError(
            f"world_size={world_size} is not a multiple of gpus_per_node={gpus_per_node}:"
            " a multi-node trial fills whole nodes"
        )
    try:
        ex = submitit.SlurmExecutor(folder=job_folder, python=cfg.python)
    except RuntimeError as err:  # submitit: srun not found
        raise ConfigError(
            f"executor.name={cfg.name!r}: srun is not on PATH ({one_line(err)}); use executor=local,"
            " or start a local cluster with scripts/slurm-local.sh start"
        ) from None
    srun_args = list(cfg.extra_srun)
    if cfg.container_image:
        srun_args.append(f"--container-image={cfg.container_image}")
    if cfg.container_mounts:
        srun_args.append(f"--container-mounts={','.join(cfg.container_mounts)}")
    params: dict[str, Any] = dict(
        job_name="hcp-tune",
        time=cfg.time_limit_min,
        nodes=math.ceil(world_size / per_node),
        ntasks_per_node=tasks_per_node or min(world_size, per_node),
        signal_delay_s=signal_delay_s,
        array_parallelism=cfg.array_parallelism,
        setup=list(cfg.setup),
        srun_args=srun_args,
        additional_parameters=dict(cfg.extra_sbatch),
    )
    gpus = gpus_per_node if cfg.gpus_per_node is None else cfg.gpus_per_node
    if gpus:
        params["gpus_per_node"] = gpus
    optional = dict(partition=cfg.partition, account=cfg.account, qos=cfg.qos, cpus_per_task=cfg.cpus_per_task)
    params.update({k: v for k, v in optional.items() if v is not None})
    if cfg.mem_gb is not None:
        params["mem"] = f"{int(cfg.mem_gb)}GB" if cfg.mem_gb == int(cfg.mem_gb) else f"{int(cfg.mem_gb * 1024)}MB"
    if cfg.exclusive:
        params["exclusive"] = True
    ex.update_parameters(**params)
    return ex


def use_steps(executor: Any, cfg: ExecutorConfig) -> None:
    """Make a SLURM executor from ``make_executor`` run a steps batch (``executor.batch``):
    the same allocation, but its batch script runs the payload once, without srun
    (submitit's ``use_srun=False``), and the payload starts each trial's ranks as a job
    step (``step_launch`` says how). With a container image the driver runs outside the
    container, so on this interpreter; the ranks run ``executor.python`` inside it."""
    executor.update_parameters(use_srun=False)
    if cfg.container_image:
        executor.python = shlex.quote(sys.executable)


def step_launch(cfg: ExecutorConfig, *, world_size: int, gpus_per_node: int) -> StepLaunch:
    """How a steps batch's driver starts a trial of ``world_size`` ranks as an srun job
    step: the nodes and tasks per node of ``make_executor``'s allocation, the python the
    ranks run (``executor.python``, else this interpreter), ``executor.extra_srun`` and the
    pyxis container (job.steps.srun_argv names it per allocation)."""
    per_node = gpus_per_node if gpus_per_node > 0 else world_size
    gpus = gpus_per_node if cfg.gpus_per_node is None else cfg.gpus_per_node
    return StepLaunch(
        nodes=math.ceil(world_size / per_node), tasks_per_node=min(world_size, per_node),
        gpus_per_node=max(0, gpus),
        python=cfg.python or sys.executable, srun_args=tuple(cfg.extra_srun),
        container_image=cfg.container_image, container_mounts=tuple(cfg.container_mounts))


def scale_time_limit(executor: Any, cfg: ExecutorConfig, trials: int) -> None:
    """A job that runs ``trials`` trials gets ``executor.time_limit_min`` for each."""
    minutes = cfg.time_limit_min * trials
    if isinstance(executor, submitit.LocalExecutor):
        executor.update_parameters(timeout_min=minutes)
    else:
        executor.update_parameters(time=minutes)


# ----------------------------------------------------------------------------- job handles


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(kw_only=True)
class JobHandle:
    """A submitted job; ``job_id``, ``executor`` and ``folder`` are what to save to re-attach."""

    job_id: str
    executor: str  # slurm | local
    folder: Path  # the job folder root (``%j`` not yet replaced)
    job: Any = field(repr=False)  # the submitit Job


@dataclass(kw_only=True)
class JobOutcome:
    """What ``poll`` found: a state and, when finished, the result or the error as data."""

    state: JobState
    result: Any = None
    error: Optional[str] = None  # the meaningful line, e.g. "ValueError: boom"
    exception: Optional[BaseException] = None  # submitit's error with the full trace
    scheduler_state: str = ""  # e.g. squeue's RUNNING, CANCELLED, TIMEOUT
    stdout: Optional[Path] = None
    stderr: Optional[Path] = None

    @property
    def finished(self) -> bool:
        return self.state in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


def _handle(job: Any, executor: str, folder: Path) -> JobHandle:
    return JobHandle(job_id=str(job.job_id), executor=executor, folder=Path(folder), job=job)


def _executor_kind(executor: Any) -> str:
    return "local" if isinstance(executor, submitit.LocalExecutor) else "slurm"


@contextlib.contextmanager
def _controller_stderr(executor: Any) -> Iterator[None]:
    """Local jobs: the submitit controller process inherits our stderr, and prints a
    KeyboardInterrupt traceback there when a job is cancelled. Point the stderr it
    inherits at a file in the job folder instead, so the user's terminal stays clean."""
    if _executor_kind(executor) != "local":
        yield
        return
    root = Path(str(executor.folder).replace("%j", "")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(root / "controllers.err", "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def submit(executor: Any, fn: Callable[..., Any], *args: Any) -> JobHandle:
    """Submit one job running ``fn(*args)``."""
    with _controller_stderr(executor):
        job = executor.submit(fn, *args)
    return _handle(job, _executor_kind(executor), executor.folder)


def submit_array(executor: Any, fn: Callable[..., Any], args_list: Sequence[Sequence[Any]]) -> list[JobHandle]:
    """Submit ``fn(*args)`` for each entry; on SLURM one job array (``array_parallelism``)."""
    jobs = []
    with _controller_stderr(executor), executor.batch():
        for args in args_list:
            jobs.append(executor.submit(fn, *args))
    return [_handle(job, _executor_kind(executor), executor.folder) for job in jobs]


def attach(folder: str | Path, job_id: str, executor_name: str) -> JobHandle:
    """A handle on a job submitted earlier (by another process), from its saved id."""
    if executor_name == "inprocess":  # a synthetic batch died with the sweep that ran it
        return JobHandle(job_id=job_id, executor="inprocess", folder=Path(folder), job=None)
    name = resolve_executor_name(executor_name)
    cls = submitit.LocalJob if name == "local" else submitit.SlurmJob
    return _handle(cls(folder=Path(folder), job_id=str(job_id)), name, Path(folder))


def job_paths(handle: JobHandle) -> tuple[Path, Path]:
    """(stdout, stderr) of task 0: where a failed trial's row points."""
    if handle.executor == "inprocess":  # runner=synthetic writes no log
        return handle.folder / f"{handle.job_id}.out", handle.folder / f"{handle.job_id}.err"
    paths = JobPaths(handle.folder, job_id=handle.job_id, task_id=0)
    return paths.stdout, paths.stderr


def _cancel_marker(handle: JobHandle) -> Path:
    return JobPaths(handle.folder, job_id=handle.job_id).folder / f"{handle.job_id}_cancelled"


def cancel(handles: Sequence[JobHandle]) -> None:
    """Cancel jobs; never raises for a job that already ended."""
    slurm_ids = [h.job_id for h in handles if h.executor == "slurm"]
    for h in handles:
        if h.executor == "inprocess":
            if h.job is not None:
                h.job.cancelled = True
            continue
        marker = _cancel_marker(h)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # cancelled, whoever polls it (a re-attached handle sees no exit code)
        if h.executor == "local":
            h.job.cancel(check=False)
    if slurm_ids:
        subprocess.run(["scancel", *slurm_ids], capture_output=True, check=False)


_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
# Pending reasons under which SLURM will never start the job as submitted: it asks for more
# than its partition has (nodes, GPUs, time) or names what does not exist. Waiting on them
# would hang the sweep; the job is cancelled and its trials fail as an environment problem.
NEVER_STARTS = {"PartitionConfig", "BadConstraints", "PartitionTimeLimit", "InvalidAccount",
                "InvalidQOS"}
UNSCHEDULABLE = "UNSCHEDULABLE"  # scheduler_state of a job with one of those reasons
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "UNREACHABLE"}


def _scheduler_states(ids: Sequence[str]) -> dict[str, str]:
    """SLURM state per job id (array tasks as ``<array>_<index>``); absent if unknown."""
    states: dict[str, str] = {}

    def ask(cmd: list[str], some: Sequence[str]) -> None:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                jid, _, rest = line.strip().partition("|")
                state, _, reason = rest.partition("|")
                if jid in ids and state:
                    state = state.split()[0]
                    if state == "PENDING" and reason.strip() in NEVER_STARTS:
                        state = f"{UNSCHEDULABLE} {reason.strip()}"
                    states.setdefault(jid, state)
        elif cmd[0] == "squeue" and "invalid job id" not in out.stderr.lower() and len(some) == 1:
            states.setdefault(some[0], "UNREACHABLE")  # controller did not answer: not an ending

    def ask_squeue(some: Sequence[str]) -> None:
        ask(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r", "-j", ",".join(some)], some)

    ask_squeue(ids)
    if len(states) < len(ids) and len(ids) > 1:  # squeue fails whole when one id was purged
        for jid in ids:
            if jid not in states:
                ask_squeue([jid])
    missing = [j for j in ids if j not in states]
    if missing and shutil.which("sacct"):
        ask(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(missing)], missing)
    return states


def _local_state(handle: JobHandle) -> str:
    """RUNNING, ENDED, or how a local job was killed from outside: its controller died
    of a signal (its name, e.g. ``SIGKILL``: with its sweep's process group, a closed
    terminal), or, re-attached by a later sweep, is gone (``KILLED``; a job whose tasks
    ended, well or not, left a result: one without is a killed one). ``poll_all`` reads
    any of these but ENDED as cancelled."""
    process = getattr(handle.job, "_process", None)
    if process is not None:
        code = process.poll()
        if code is None:
            return "RUNNING"
        return signal.Signals(-code).name if code < 0 and -code in _SIGNALS else "ENDED"
    try:  # re-attached: the job id is the controller's pid
        with open(f"/proc/{int(handle.job_id)}/stat") as f:
            return "KILLED" if f.read().rsplit(")", 1)[1].split()[0] in "ZX" else "RUNNING"
    except (OSError, ValueError, IndexError):
        return "KILLED"


_SIGNALS = {int(s) for s in signal.Signals}


def _error_line(trace: str) -> str:
    """The line naming the exception in a traceback (``ValueError: boom``)."""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~", "During handling", "The above exception", "Traceback")):
            return ln
    return lines[-1] if lines else "no traceback"


def _outcome_from_files(handle: JobHandle) -> Optional[JobOutcome]:
    """The outcome recorded by the job's tasks, or None while task 0 wrote nothing."""
    out, err = job_paths(handle)
    task0 = handle.job.task(0) if handle.job.num_tasks > 1 else handle.job
    if not task0.paths.result_pickle.exists():
        return None
    outcome, value = submitit.core.utils.pickle_load(task0.paths.result_pickle)
    if outcome == "success":
        return JobOutcome(state=JobState.DONE, result=value, stdout=out, stderr=err)
    exc = task0.exception()  # returned, not raised: it carries the trace and the log paths
    return JobOutcome(
        state=JobState.FAILED, error=one_line(_error_line(str(value))), exception=exc, stdout=out, stderr=err
    )


def poll_all(handles: Sequence[JobHandle]) -> list[JobOutcome]:
    """Outcomes of several jobs with one scheduler query."""
    if any(h.executor == "inprocess" for h in handles):
        return [_inprocess(h) if h.executor == "inprocess" else poll_all([h])[0]
                for h in handles]
    found = [_outcome_from_files(h) for h in handles]
    open_slurm = [h.job_id for h, o in zip(handles, found) if o is None and h.executor == "slurm"]
    sched = _scheduler_states(open_slurm) if open_slurm else {}
    outcomes = []
    for h, o in zip(handles, found):
        if o is not None:
            outcomes.append(o)
            continue
        state = sched.get(h.job_id, "UNKNOWN") if h.executor == "slurm" else _local_state(h)
        out, err = job_paths(h)
        if state.startswith(UNSCHEDULABLE):
            reason = state.split()[-1]
            subprocess.run(["scancel", h.job_id], capture_output=True, check=False)
            msg = (f"SLURM will never start job {h.job_id} as submitted (pending, "
                   f"reason {reason}: it asks for more nodes, GPUs or time than the partition "
                   "has, or names an account/QOS/constraint that does not exist); cancelled it. "
                   "Check the cluster profile (gpus_per_node) and executor.partition/"
                   "time_limit_min, or give tp=/pp= for a smaller world")
            outcomes.append(JobOutcome(state=JobState.FAILED, error=msg, scheduler_state=state,
                                       stdout=out, stderr=err))
        elif state in _PENDING:
            outcomes.append(JobOutcome(state=JobState.PENDING, scheduler_state=state, stdout=out, stderr=err))
        elif state in _RUNNING:
            outcomes.append(JobOutcome(state=JobState.RUNNING, scheduler_state=state, stdout=out, stderr=err))
        else:  # ended without a result (or ended just now: look once more)
            late = _outcome_from_files(h)
            if late is not None:
                outcomes.append(late)
            elif (state == "CANCELLED" or _cancel_marker(h).exists()
                  or (h.executor == "local" and state != "ENDED")):  # killed from outside
                outcomes.append(JobOutcome(state=JobState.CANCELLED, scheduler_state=state, stdout=out, stderr=err))
            else:
                msg = f"job {h.job_id} ended ({state}) without a result; logs: {err}"
                outcomes.append(
                    JobOutcome(state=JobState.FAILED, error=msg, scheduler_state=state, stdout=out, stderr=err)
                )
    return outcomes


def _inprocess(handle: JobHandle) -> JobOutcome:
    """runner=synthetic's batch (``synthetic.Job``): one step further per poll; a handle
    re-attached after the sweep that ran it ended is cancelled (the next run redraws it)."""
    job = handle.job
    if job is None or job.cancelled:
        return JobOutcome(state=JobState.CANCELLED, scheduler_state="CANCELLED")
    job.step()
    return JobOutcome(state=JobState.DONE if job.finished else JobState.RUNNING,
                      result=None)


def poll(handle: JobHandle) -> JobOutcome:
    """The job's state now, with its result or its error (never raised)."""
    return poll_all([handle])[0]
