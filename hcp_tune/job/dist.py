"""Distributed start and stop for one job: where rank, world size and master come from, and
the world process group (nccl on CUDA, gloo on CPU) with a timeout.

One source for both of hcp-tune's executors: submitit's ``JobEnvironment`` (the job was
started by submitit, locally or on SLURM, so it is importable). It gives the global rank,
local rank, task count, host names and job id (``SUBMITIT_LOCAL_*`` variables under the
local executor, ``SLURM_*`` under SLURM); the master is the first host (loopback for a
local job) and the port is derived from the job id, so every task agrees on it without
talking. Recognised in this order:

- ``submitit``: SUBMITIT_EXECUTOR is set (``local`` or ``slurm``); ``source`` is its name;
- ``torchrun``: TORCHELASTIC_RUN_ID (or LOCAL_RANK) with RANK, WORLD_SIZE, MASTER_*
  (``python -m hcp_tune.job.entry`` started by hand);
- ``slurm``: a plain srun task (SLURM_JOB_ID and SLURM_PROCID), read by submitit's SLURM
  parser.

Anything else is a single process (world size 1).

The timeout matters: a rank that dies must not leave the others waiting forever. With gloo
a dead peer usually closes its sockets and the survivors fail at once; a hung peer is
caught by the timeout. The executor's time limit is the backstop.
"""
from __future__ import annotations

import datetime
import os
import random
import re
import socket
from dataclasses import dataclass

JOB_PORT_BASE = 20000  # ports 20000..31999: above the usual services, below Linux's
JOB_PORT_SPAN = 12000  # ephemeral range (32768..), where outgoing connections take ports


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job, and where the rendezvous is."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    source: str  # local | slurm (submitit's executor) | torchrun | single
    hosts: tuple[str, ...] = ()
    job_id: str | None = None


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_ports(offset: int | None = None, n: int = 1, *, tries: int = 64) -> int:
    """The first of ``n`` consecutive ports that all bind now, searched from
    ``JOB_PORT_BASE + offset`` (a random offset when None) within the span below the
    ephemeral range: a bind-to-0 port, or its neighbours, can be taken by an outgoing
    connection (gloo's pairs make many) before rank 0 listens there, and ranks that reach
    a stranger's socket wait out their timeout. Falls back to ``free_port`` when nothing
    in ``tries`` starts binds."""
    offset = random.randrange(JOB_PORT_SPAN) if offset is None else offset
    for i in range(tries):
        first = (offset + i * n) % (JOB_PORT_SPAN - n)
        if all(_binds(JOB_PORT_BASE + first + k) for k in range(n)):
            return JOB_PORT_BASE + first
    return free_port()


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def job_port(job_id: str) -> int:
    """A port every task of one job derives alike from the job id (SLURM's, or a local
    job's controller pid; array jobs ``123_4`` use all their digits)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return JOB_PORT_BASE + int(digits) % JOB_PORT_SPAN


def _int(env: dict, key: str, default: int | None = None) -> int:
    if key not in env:
        if default is None:
            raise RuntimeError(f"launcher environment lacks {key}")
        return default
    return int(env[key])


def _from_vars(env: dict, source: str) -> DistEnv:
    return DistEnv(
        rank=_int(env, "RANK"),
        local_rank=_int(env, "LOCAL_RANK", 0),
        world_size=_int(env, "WORLD_SIZE"),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT"),
        source=source,
        hosts=(env.get("MASTER_ADDR", "127.0.0.1"),),
        job_id=env.get("TORCHELASTIC_RUN_ID"),
    )


def _from_job(job, source: str, *, local: bool) -> DistEnv:
    hosts = tuple(job.hostnames)
    return DistEnv(
        rank=job.global_rank,
        local_rank=job.local_rank,
        world_size=job.num_tasks,
        master_addr="127.0.0.1" if local else hosts[0],
        master_port=job_port(job.job_id),
        source=source,
        hosts=hosts,
        job_id=str(job.job_id),
    )


def _submitit():
    try:
        import submitit  # only here: present in any job submitit started
    except ImportError as e:
        raise RuntimeError(
            "SLURM job without submitit: start trials through hcp-tune's executor "
            "(submitit), or with torchrun/srun setting RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
        ) from e
    return submitit


def task_paths(job_id: str | None, task: int):
    """submitit's on-disk names (``JobPaths``: logs, result pickle) of one task of this job,
    in the job folder (shared between nodes); None outside a submitit job."""
    folder = os.environ.get("SUBMITIT_FOLDER")
    if not folder or job_id is None:
        return None
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id, task_id=task)


def detect_env(environ: dict | None = None) -> DistEnv:
    """This process's place in its job (see the module docstring for the order).

    ``environ`` (tests) is read for the choice of source; submitit reads ``os.environ``."""
    env = dict(os.environ if environ is None else environ)
    executor = env.get("SUBMITIT_EXECUTOR")
    if executor:
        job = _submitit().JobEnvironment()
        return _from_job(job, executor, local=executor == "local")
    if "RANK" in env and "WORLD_SIZE" in env and (
        "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env
    ):
        return _from_vars(env, "torchrun")
    if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
        _submitit()
        from submitit.slurm.slurm import SlurmJobEnvironment

        return _from_job(SlurmJobEnvironment(), "slurm", local=False)
    return DistEnv(0, 0, 1, "127.0.0.1", free_port(), "single", (socket.gethostname(),))


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def bind_device(local_rank: int) -> int | None:
    """Bind this process to GPU ``local_rank % device_count``; None where there is no CUDA.

    Must run before anything creates a CUDA object (tensor, stream, event, or a call of
    ``torch.cuda.current_device()``): those would bind every rank to GPU 0, and NCCL then
    fails with a duplicate-GPU error or hangs. TE's CP test binds ``rank % device_count``
    the same way. Bridge v0.6.0's ``initialize`` instead calls ``set_device(LOCAL_RANK)``
    (``set_device(0)`` with ``dist.external_gpu_device_mapping``), so the Bridge runner
    sets that field when the index returned here is 0 on a task whose local rank is not
    (``bridge.runner.device_fields``) and leaves ``LOCAL_RANK`` the task's own. The
    modulo covers both a node whose tasks each see all GPUs and one whose tasks see only
    their own (``--gpus-per-task=1``: index 0).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return index


def init_distributed(env: DistEnv, *, device_type: str, timeout_s: float) -> bool:
    """Join the world group; True when this call created it (so it should destroy it).

    ``timeout_s`` is the process-group timeout: collectives that wait longer on a peer fail.
    On CUDA the rank must already be bound to its GPU (``bind_device``).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    os.environ["MASTER_ADDR"] = env.master_addr
    os.environ["MASTER_PORT"] = str(env.master_port)
    dist.init_process_group(
        backend=backend_for(device_type),
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return True


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
