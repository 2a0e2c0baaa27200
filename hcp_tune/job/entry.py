"""One measured trial, run on every rank: ``run_trial(spec) -> TrialResult``.

Order: job environment -> this rank's GPU bound (before any CUDA object) -> backend
-> world group (with the comm timeout) -> Megatron-Core groups, read back and compared with
the plan -> the CP-active proof on a small input -> warm-up and measured steps ->
statistics, FLOP/s, physical check -> every group the trial created destroyed. Every rank
returns a result; rank 0's is the authoritative one (verdicts are broadcast from it).
Nothing here raises for a trial failure: exceptions become FAILED results with a failure
class and the first meaningful error line.

A job (``job.payload.batch_payload``, under submitit's local executor or SLURM alike) runs
``run_batch`` on every rank: its trials one after another in the same processes (the world
group built once, a layout's groups kept while the next trial has the same layout, its
proof run once); after a FAILED trial the rest are SKIPPED, since the process group may be
broken. Each trial's result is written the moment it ends: rank 0 writes ``result_path``;
rank r > 0 writes ``<stem>.rank<r>.json`` beside it (``merge_root_cause`` reads them when
rank 0 only saw a lost peer). What ends a job whose ranks did not all finish, on both
executors: a hung peer ends itself shortly after rank 0's task ended; past the job's time
limit the executor kills every task.

By hand (torchrun, srun without submitit)::

    python -m hcp_tune.job.entry SPEC.json OUT.json [SPEC2.json OUT2.json ...]
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hcp_tune.spec import (
    FailureClass, Status, TrialResult, TrialSpec, atomic_write_text, classify_error_text,
    first_error_line, result_from_json, spec_from_json, to_json,
)

FAULTS = (None, "cp_off", "no_groups", "raise", "kill_rank", "hang_rank")
KILL_EXIT_CODE = 17
PEER_FILES_WAIT_S = 10.0  # rank 0, after a failed trial: how long it waits for peers' files
PEER_LINGER_S = 10.0  # a peer still running this long after rank 0's task ended exits
POLL_S = 0.2


class EnvironmentProblem(RuntimeError):
    """The software or hardware this trial needs is absent (FailureClass.ENVIRONMENT)."""


def classify(exc: BaseException) -> tuple[FailureClass, str]:
    from hcp_tune.job.bench import TimeLimitReached

    line = first_error_line(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeLimitReached):
        return FailureClass.TIME_LIMIT, line
    if type(exc).__name__ == "UncompletedJobError":  # submitit, on the executor's signal
        # (SLURM's or the local controller's USR2 shortly before executor.time_limit_min)
        return FailureClass.TIME_LIMIT, first_error_line(
            f"time limit: executor.time_limit_min is about to pass ({line})")
    if isinstance(exc, (EnvironmentProblem, ImportError)):
        return FailureClass.ENVIRONMENT, line
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return FailureClass.OOM, line
    return classify_error_text(f"{type(exc).__name__}: {exc}"), line


def _reference_dtype(spec: TrialSpec) -> str:
    """The torch reference's dtype: fp32 unless backend=torch asks for bf16/fp16 explicitly
    (then it is proven the same-dtype way, as the TE path is: the GPU proof, on gloo)."""
    return spec.dtype if spec.backend == "torch" else "fp32"


@dataclass(frozen=True)
class Backend:
    """The attention implementation a trial runs, where, in which dtype, and why."""

    name: str  # te | torch
    device: Any  # torch.device
    dtype: str  # bf16 | fp16 | fp32
    note: str = ""  # set when the choice differs from what the spec asked for


def choose_backend(spec: TrialSpec, cuda_index: Optional[int]) -> Backend:
    """TE on CUDA (sm80+, TE >= 1.12, bf16/fp16), else the torch reference.

    ``cuda_index`` is the GPU this rank is already bound to (``dist.bind_device``), None
    without CUDA. Nothing here may touch a device before that binding.
    """
    import torch

    from hcp_tune.job.te_attention import cp_capability_problem, te_unavailable_reason

    if spec.runner != "attention":
        raise EnvironmentProblem(f"runner {spec.runner!r} is not implemented in this job yet")
    if spec.backend not in ("auto", "te", "torch"):
        raise EnvironmentProblem(f"unknown backend {spec.backend!r}: expected auto, te or torch")
    if spec.device == "cuda" and cuda_index is None:
        raise EnvironmentProblem(
            "no CUDA device on this node, but the trial is for a GPU cluster profile "
            "(measure CPU trials with cluster=local)")
    if cuda_index is None:
        if spec.backend == "te":
            raise EnvironmentProblem(f"backend=te requested, but {te_unavailable_reason()}")
        return Backend("torch", torch.device("cpu"), _reference_dtype(spec))
    device = torch.device("cuda", cuda_index)
    if spec.backend == "torch":
        return Backend("torch", device, _reference_dtype(spec))
    problem = cp_capability_problem(cuda_index)
    if problem:  # the torch reference would measure something no training run can use
        raise EnvironmentProblem(problem)
    reason = te_unavailable_reason()
    if reason:
        if spec.backend == "te":
            raise EnvironmentProblem(f"backend=te requested, but {reason}")
        return Backend("torch", device, "fp32",
                       f"backend=auto: {reason}; the pure-torch reference ran instead (fp32)")
    if spec.dtype == "fp32":
        if spec.backend == "te":
            raise EnvironmentProblem("the TE path runs bf16 or fp16, not fp32: set dtype=bf16")
        return Backend("torch", device, "fp32",
                       "backend=auto with dtype=fp32: TE's CP attention runs bf16/fp16 only; "
                       "the pure-torch reference ran instead")
    return Backend("te", device, spec.dtype)


def fingerprint(env, device) -> dict:
    import importlib.metadata as md

    import torch
    import torch.distributed as dist

    from hcp_tune.job import knobs
    from hcp_tune.job.te_attention import te_version

    def dist_version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    fp = {
        "hosts": sorted(set(hosts)),
        "launcher": env.source,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "megatron_core": dist_version("megatron-core") or dist_version("megatron_core"),
        "transformer_engine": te_version(),
        "megatron_bridge": dist_version("megatron-bridge") or dist_version("megatron_bridge"),
        "cuda": torch.version.cuda,
        "gpu": None, "driver": None, "nccl": None,
        "settings": knobs.settings(),  # NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*
        "inject_delay": knobs.injected_delay(),  # a testing aid: never a real measurement
    }
    if device.type == "cuda":
        fp["gpu"] = torch.cuda.get_device_name(device)
        fp["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import subprocess

            fp["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return fp


def _build_attention(spec, backend, groups):
    cp_off = spec.inject_fault == "cp_off"
    if backend == "te":
        from hcp_tune.job.te_attention import TEAttention

        return TEAttention(heads=spec.heads // spec.tp, kv_heads=spec.kv_heads // spec.tp,
                           head_dim=spec.head_dim, groups=groups, comm_type=spec.comm_type,
                           qkv_format=spec.qkv_format, cp_off=cp_off)
    from hcp_tune.job.ref_attention import build_ref_attention

    return build_ref_attention(groups, spec.comm_type, cp_off=cp_off)


def _no_cp_reference(spec, backend: str, dtype: str):
    """For the same-dtype proof (bf16/fp16): a factory of the same attention over all
    heads, without CP; None for fp32, which is checked against float64."""
    if dtype == "fp32":
        return None  # checked against float64 causal attention instead
    if backend != "te":
        from hcp_tune.job.ref_attention import RefHCPAttention

        return RefHCPAttention  # no groups: the whole sequence in one process

    def build():
        from hcp_tune.job.te_attention import TEAttention

        return TEAttention(heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                           groups=None, comm_type="none", qkv_format=spec.qkv_format)
    return build


def _numerics_error(v: dict) -> str:
    worst = max(v["errors"], key=v["errors"].get)
    return (f"CP result differs from single-process attention: {worst} error "
            f"{v['errors'][worst]:.3g} > tolerance {v['tolerance']:.3g} (is CP communication active?)")


def _progress(spec, step: int, t: float) -> None:
    if spec.progress_path:
        with open(spec.progress_path, "a") as f:
            f.write(json.dumps({"trial_id": spec.trial_id, "step": step, "time_s": t}) + "\n")


def _measure(spec, attn, device, dtype, rank, t0):
    import torch

    from hcp_tune.job import bench
    from hcp_tune.job.verify import DTYPES

    g = torch.Generator().manual_seed(spec.seed + 1 + rank)
    s_local = spec.seq // spec.cp
    hq, hk = spec.heads // spec.tp, spec.kv_heads // spec.tp
    fmt = getattr(attn, "qkv_format", "bshd")

    def rnd(h, grad=True):  # created in the attention's own layout: no transpose is timed
        outer = (s_local, spec.mbs) if fmt == "sbhd" else (spec.mbs, s_local)
        t = torch.randn(*outer, h, spec.head_dim, generator=g)
        return t.to(device=device, dtype=DTYPES[dtype]).requires_grad_(grad)

    q, k, v, dout = rnd(hq), rnd(hk), rnd(hk), rnd(hq, grad=False)
    kill_at = spec.warmup_steps  # the first measured step
    world = spec.world_size

    def step(i):
        if spec.inject_fault == "kill_rank" and i == kill_at and rank == world - 1:
            sys.stdout.flush()
            os._exit(KILL_EXIT_CODE)  # tests only: a rank lost mid-trial
        if spec.inject_fault == "hang_rank" and i == kill_at and rank == world - 1:
            threading.Event().wait()  # tests only: a rank that stops answering, forever
        q.grad = k.grad = v.grad = None
        attn(q, k, v).backward(dout)

    return bench.time_steps(
        step, warmup=spec.warmup_steps, measure=spec.measure_steps, device=device,
        should_stop=lambda: time.monotonic() - t0 > spec.time_limit_s,
        on_step=(lambda i, t: _progress(spec, i, t)) if rank == 0 else None,
        stop_requested=lambda: bool(spec.stop_path) and os.path.exists(spec.stop_path),
    )


def resources() -> dict[str, Any]:
    """Open file descriptors and live process groups of this process (a pile-up shows here)."""
    from hcp_tune.job.groups import registered_groups

    fd_dir = "/proc/self/fd"
    return {"open_fds": len(os.listdir(fd_dir)) if os.path.isdir(fd_dir) else None,
            "process_groups": len(registered_groups())}


def _teardown_groups(before: frozenset, device, *, clean: bool) -> None:
    """Destroy this trial's groups; after a failure only forget them (a peer may be gone)."""
    from hcp_tune.job.groups import destroy_groups

    if clean:  # every rank got the same verdict, so every rank is here: safe to meet
        import torch
        import torch.distributed as dist

        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)  # nothing of ours still runs on a communicator
        dist.barrier()
    destroy_groups(before, destroy_communicators=clean)


@dataclass
class ProcessSet:
    """What a batch's processes keep between trials: the groups of the layout that ran
    last (reused while the next trial has the same layout, destroyed when it changes) and
    the numerics verdict of every layout proven so far (the proof runs once per layout per
    process set; every trial still checks its groups and its TFLOP/s)."""

    layout: Optional[tuple] = None  # (tp, a2a, p2p, hierarchical) of the live groups
    before: Optional[frozenset] = None  # the groups that existed before the live ones
    proofs: dict = None  # proof key -> verdict dict
    ended: Optional[float] = None  # monotonic time the previous trial's wall_s ended
    fingerprint: Optional[dict] = None  # the same processes, the same environment: taken once

    def __post_init__(self) -> None:
        self.proofs = {} if self.proofs is None else self.proofs


def _layout_key(spec: TrialSpec) -> tuple:
    return (spec.tp, spec.a2a, spec.p2p, spec.inject_fault != "no_groups")


def _proof_key(spec: TrialSpec, backend: str, dtype: str) -> tuple:
    """Everything the proof's verdict depends on (not seq: it runs at its own small size)."""
    return (_layout_key(spec), backend, dtype, spec.heads, spec.kv_heads, spec.head_dim,
            spec.mbs, spec.qkv_format, spec.seed, spec.verify_seq, spec.inject_fault)


def _stop_reason(spec: TrialSpec) -> Optional[str]:
    """The orchestrator's stop file's text, or None when there is none."""
    if not spec.stop_path:
        return None
    try:
        return Path(spec.stop_path).read_text().strip() or "stopped by the orchestrator"
    except OSError:
        return None


def run_trial(spec: TrialSpec, *, env=None, keep_process_group: bool = False,
              pset: Optional[ProcessSet] = None, keep_groups: bool = False) -> TrialResult:
    """Run one trial on this rank; never raises for a trial failure.

    With ``pset`` (a batch), the groups of the previous trial are reused when the layout is
    the same and its proof's verdict is reused; ``keep_groups`` keeps this trial's groups
    for the next one (the caller knows it has the same layout).
    """
    if spec.runner == "bridge":  # a Bridge training run: job/bridge_runner.py
        from hcp_tune.job.bridge_runner import run_bridge_trial

        return run_bridge_trial(spec, env=env)
    t0 = time.monotonic()
    res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, world_size=spec.world_size)
    created = False
    before = None  # the process groups that existed before this trial's, once it makes some
    device = None
    pset = pset if pset is not None else ProcessSet()
    phases = res.phases_s  # disjoint; what wall_s has besides them is this function's own
    if pset.ended is not None:  # since the previous trial's wall_s: its teardown, result write
        phases["between"] = t0 - pset.ended
    try:
        if spec.inject_fault not in FAULTS:
            raise ValueError(f"inject_fault={spec.inject_fault!r}: expected one of {FAULTS}")
        from hcp_tune.job import bench
        from hcp_tune.job.dist import bind_device, detect_env, init_distributed
        from hcp_tune.job.groups import check_groups, init_groups, read_groups
        from hcp_tune.job.verify import verify_cp

        phases["imports"] = time.monotonic() - t0  # torch and the job modules: once per process
        env = env or detect_env()
        res.job_id = env.job_id
        if env.world_size != spec.world_size:
            raise EnvironmentProblem(
                f"the job started {env.world_size} processes, the trial needs "
                f"tp*cp = {spec.tp}*{spec.cp} = {spec.world_size}")
        # the GPU binding comes first: anything CUDA before it would land on GPU 0
        chosen = choose_backend(spec, bind_device(env.local_rank))
        backend, device, dtype = chosen.name, chosen.device, chosen.dtype
        res.backend = backend
        if chosen.note:
            res.notes.append(chosen.note)
        created = init_distributed(env, device_type=device.type, timeout_s=spec.comm_timeout_s)
        if pset.fingerprint is None:  # a collective and package look-ups: once per process set
            pset.fingerprint = fingerprint(env, device)
        res.fingerprint = dict(pset.fingerprint)
        phases["start"] = time.monotonic() - t0 - phases["imports"]  # world group, fingerprint
        if spec.inject_fault == "raise":
            raise RuntimeError("injected fault (tests only): raise\nsecond line is not reported")
        res.resources = resources()
        # Megatron-Core's import is counted in "imports", not "groups"; it stays after the
        # GPU binding (importing it may touch a device)
        t = time.monotonic()
        importlib.import_module("megatron.core.parallel_state")
        phases["imports"] += time.monotonic() - t
        t = time.monotonic()
        if pset.layout == _layout_key(spec) and pset.before is not None:
            before = pset.before  # the same layout ran last in these processes: reuse
            res.notes.append("groups reused from the previous trial in the same processes")
        else:
            if pset.before is not None:  # another layout's groups are still up: replace them
                _teardown_groups(pset.before, device, clean=True)
            pset.layout, pset.before = None, None
            before = init_groups(tp=spec.tp, a2a=spec.a2a, p2p=spec.p2p,
                                 timeout_s=spec.comm_timeout_s,
                                 hierarchical=spec.inject_fault != "no_groups")
        groups = read_groups()
        res.verification["groups"] = check_groups(groups, spec)
        phases["groups"] = time.monotonic() - t
        if not res.verification["groups"]["match"]:
            res.status, res.error = Status.INVALID, res.verification["groups"]["problems"][0]
            return res
        attn = _build_attention(spec, backend, groups)
        res.qkv_format = getattr(attn, "qkv_format", "bshd")
        t = time.monotonic()
        proof_key = _proof_key(spec, backend, dtype)
        v = pset.proofs.get(proof_key)
        if v is None:
            v = verify_cp(spec, attn, tp_rank=groups.tp_rank, cp_pos=groups.cp_rank,
                          device=device, dtype=dtype,
                          reference=_no_cp_reference(spec, backend, dtype))
            pset.proofs[proof_key] = v
            res.verification["numerics"] = v
        else:  # proven earlier in these processes, with this layout's real groups
            res.verification["numerics"] = dict(v, reused=True)
        phases["proof"] = time.monotonic() - t
        res.te_backend = getattr(attn, "selected_backend", "")
        if not v["passed"]:
            res.status, res.failure_class = Status.INVALID, FailureClass.NUMERICS
            res.error = _numerics_error(v)
            return res
        t = time.monotonic()
        try:
            timing = _measure(spec, attn, device, dtype, env.rank, t0)
        except bench.StopRequested as stop:  # early stop or Ctrl-C: the processes are fine
            res.status, res.step_times_s = Status.PRUNED, stop.steps
            if stop.steps:
                res.median_s = bench.summarize(stop.steps)["median_s"]
            res.error = _stop_reason(spec) or str(stop)
            return res
        phases["warmup"] = timing.warmup_s
        phases["measure"] = time.monotonic() - t - timing.warmup_s
        res.te_backend = getattr(attn, "selected_backend", "")  # the timed shapes' kernel
        stats = bench.summarize(timing.step_times_s)
        res.step_times_s = timing.step_times_s
        res.median_s, res.p10_s, res.p90_s = stats["median_s"], stats["p10_s"], stats["p90_s"]
        res.peak_mem_bytes, res.mem_note = timing.peak_mem_bytes, timing.mem_note
        res.flops_per_gpu_step = bench.flops_per_gpu(spec)
        res.tflops_per_gpu = res.flops_per_gpu_step / res.median_s / 1e12
        res.verification["flops"] = (
            "causal attention fwd = 4*mbs*seq^2*heads*head_dim/2, bwd = 2.5*fwd "
            "(FlashAttention convention), per GPU = total/(cp*tp)")
        too_fast = bench.over_peak(res.tflops_per_gpu, spec.peak_tflops)
        if too_fast:
            res.status, res.error = Status.INVALID, too_fast
            return res
        res.status = Status.OK
        return res
    except Exception as e:  # a failure is a result
        res.status = Status.FAILED
        res.failure_class, res.error = classify(e)
        return res
    finally:
        res.wall_s = time.monotonic() - t0
        pset.ended = t0 + res.wall_s
        try:
            if before is not None:
                if keep_groups and res.status != Status.FAILED:
                    pset.layout, pset.before = _layout_key(spec), before
                else:
                    pset.layout, pset.before = None, None
                    _teardown_groups(before, device, clean=res.status != Status.FAILED)
            if created and not keep_process_group:
                from hcp_tune.job.dist import destroy_distributed

                destroy_distributed()
        except Exception:  # teardown after a broken group: the result says what happened
            pass


def run_trials(specs: list[TrialSpec], on_result: Optional[Callable[[TrialResult], None]] = None
               ) -> list[TrialResult]:
    """Several trials in the same processes; after a FAILED one the rest are SKIPPED.

    The world group is created once, with the first trial's ``comm_timeout_s``; a layout's
    groups are built once for consecutive trials of that layout (order the specs by layout
    to profit) and its proof runs once per process set. ``on_result`` gets each trial's
    result the moment it ends (the batch payloads write it to ``spec.result_path``), so a
    batch killed half-way keeps what it measured. A FAILED trial may leave the processes
    unusable, so the rest come back SKIPPED ("not run") for the orchestrator to requeue.
    """
    out: list[TrialResult] = []
    broken: Optional[TrialResult] = None
    pset = ProcessSet()
    bridge_ran: Optional[str] = None
    for i, spec in enumerate(specs):
        if spec.runner == "bridge" and bridge_ran is not None:
            res = TrialResult(  # bridge_runner.py: Bridge sets up global state per run
                trial_id=spec.trial_id, status=Status.SKIPPED, world_size=spec.world_size,
                error=f"not run: Bridge trials run one per process ({bridge_ran} ran here)")
            out.append(res)
            if on_result is not None:
                on_result(res)
            continue
        if spec.runner == "bridge":
            bridge_ran = spec.trial_id
        if broken is not None:
            res = TrialResult(
                trial_id=spec.trial_id, status=Status.SKIPPED, world_size=spec.world_size,
                error=f"not run: trial {broken.trial_id} failed before it in the same processes")
        else:
            nxt = specs[i + 1] if i + 1 < len(specs) else None
            same = nxt is not None and _layout_key(nxt) == _layout_key(spec)
            res = run_trial(spec, keep_process_group=True, pset=pset, keep_groups=same)
            if res.status == Status.FAILED:
                broken = res
        out.append(res)
        if on_result is not None:
            on_result(res)
    if broken is None:
        from hcp_tune.job.dist import destroy_distributed

        destroy_distributed()
    return out


def write_result(res: TrialResult, out: Path, rank: int) -> None:
    """This rank's result file for one trial (rank 0's is the one the orchestrator reads)."""
    atomic_write_text(str(rank_out_path(out, rank)), to_json(res))


def _share_cpus(env) -> None:
    """The ranks on a node share its cores: without a bound every rank starts a thread per
    core, and CPU trials measure the oversubscription (2 ranks x 2 threads on 2 cores ran
    the same steps 4-8x slower). Threads per rank: ``SLURM_CPUS_PER_TASK`` when SLURM gave
    each task its CPUs, else the cores this process may use over the ranks on its node.
    ``OMP_NUM_THREADS`` set by the user wins. Before torch loads (else torch is told)."""
    if env.source == "single" or "OMP_NUM_THREADS" in os.environ:
        return
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        threads = int(per_task)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        on_node = max(1, env.world_size // max(1, len(env.hosts)))
        threads = max(1, (cores or 1) // on_node)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def _end_with_rank0(env) -> None:
    """A peer (rank > 0) that is still running ``PEER_LINGER_S`` after rank 0's task ended is
    hung (rank 0 has its results): it exits, so the job ends on either executor. Rank 0's
    end is submitit's result file of task 0 (written when its payload returned or raised)."""
    from hcp_tune.job.dist import task_paths

    task0 = task_paths(env.job_id, 0)
    if task0 is None:
        return
    marker = task0.result_pickle

    def watch() -> None:
        while not marker.exists():
            time.sleep(POLL_S * 5)
        deadline = time.monotonic() + PEER_LINGER_S
        while time.monotonic() < deadline:  # a normal end exits the process meanwhile
            time.sleep(POLL_S)
        print(f"[rank {env.rank}] still running {PEER_LINGER_S:.0f}s after rank 0's task "
              "ended: exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="hcp-tune-end-with-rank0", daemon=True).start()


def _wait_for_peer_files(specs: list[TrialSpec], results: list[TrialResult], world: int) -> None:
    """Rank 0, after a FAILED trial: give the peers a moment to write their result files, so
    that ``merge_root_cause`` (when the orchestrator reads the result) sees a peer's cause."""
    for spec, res in zip(specs, results):
        if res.status != Status.FAILED or not spec.result_path:
            continue
        paths = [rank_out_path(Path(spec.result_path), r) for r in range(1, world)]
        deadline = time.monotonic() + PEER_FILES_WAIT_S
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(POLL_S)


def _exit_without_teardown() -> None:
    """At interpreter exit, skip the teardown: after a failure the process group may be
    broken, and destroying it can wait on a peer that is gone. (Job processes only: submitit
    has written the task's result by then.)"""
    import atexit
    import logging

    def leave() -> None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    atexit.register(leave)


def run_batch(specs: list[TrialSpec]) -> list[TrialResult]:
    """A job's body on one rank, for both executors: each result written to its
    ``result_path`` at once; a hung peer ends with rank 0 (``_end_with_rank0``)."""
    from hcp_tune.job.dist import detect_env

    env = detect_env()
    _share_cpus(env)
    if env.rank != 0:
        _end_with_rank0(env)
    by_id = {s.trial_id: s for s in specs}

    def write(res: TrialResult) -> None:
        path = by_id[res.trial_id].result_path
        if path:
            write_result(res, Path(path), env.rank)
        print(f"[rank {env.rank}] {res.trial_id}: {res.status.value}"
              + (f" ({res.failure_class.value}) {res.error}" if res.failure_class else
                 f" {res.error}" if res.error else ""), flush=True)

    results = run_trials(specs, on_result=write)
    if any(r.status == Status.FAILED for r in results):
        if env.rank == 0:
            _wait_for_peer_files(specs, results, env.world_size)
        if os.environ.get("SUBMITIT_EXECUTOR"):
            _exit_without_teardown()
    return results


def rank_out_path(out: Path, rank: int) -> Path:
    return out if rank == 0 else out.with_name(f"{out.stem}.rank{rank}{out.suffix}")


def merge_root_cause(res: TrialResult, out: Path, world: int) -> TrialResult:
    """The one place a peer's root cause joins rank 0's result: when rank 0 only saw a
    lost peer (``comm``), the first other rank that failed for its own reason is named
    (``... (cause: oom: ...)``); when none did, the ranks that wrote no result (died, were
    killed or hung: see their logs). The orchestrator applies it to every result it reads,
    from either executor; applying it twice is safe."""
    if (res.status != Status.FAILED or res.failure_class != FailureClass.COMM
            or "(cause: " in (res.error or "")):
        return res
    silent = []
    for r in range(1, world):
        try:
            other = result_from_json(rank_out_path(Path(out), r).read_text())
        except OSError:
            silent.append(r)
            continue
        except ValueError:
            continue
        if other.status == Status.FAILED and other.failure_class not in (None, FailureClass.COMM):
            res.error = f"{res.error} (cause: {other.failure_class.value}: {other.error})"
            return res
    if silent:
        res.error = f"{res.error} (cause: ranks {silent} wrote no result; see their logs)"
    return res


def main(argv: Optional[list[str]] = None) -> int:
    """By hand: each SPEC.json runs with OUT.json as its ``result_path``."""
    import dataclasses

    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) % 2:
        print("usage: python -m hcp_tune.job.entry SPEC.json OUT.json [SPEC.json OUT.json ...]",
              file=sys.stderr)
        return 2
    specs = [dataclasses.replace(spec_from_json(Path(args[i]).read_text()),
                                 result_path=str(Path(args[i + 1]).resolve()))
             for i in range(0, len(args), 2)]
    results = run_batch(specs)
    code = 1 if any(r.status == Status.FAILED for r in results) else 0
    if code:  # the process group may be broken: do not wait in interpreter teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
