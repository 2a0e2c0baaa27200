"""One measured attention trial on this rank: ``run_trial(spec) -> TrialResult``.

Order: job environment -> this rank's GPU bound (before any CUDA object) -> backend
-> world group (with the comm timeout) -> Megatron-Core groups, read back and compared with
the plan -> the CP-active proof on a small input -> warm-up and measured steps ->
statistics, FLOP/s, physical check -> every group the trial created destroyed. Every rank
returns a result; rank 0's is the authoritative one (verdicts are broadcast from it).
Nothing here raises for a trial failure: exceptions become FAILED results with a failure
class and the first meaningful error line. A ``runner=bridge`` spec goes to
``job.bridge.runner`` instead. ``ProcessSet`` is what a batch keeps between trials.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from hcp_tune.job.backend import choose_backend, fingerprint
from hcp_tune.job.failures import FAULTS, KILL_EXIT_CODE, EnvironmentProblem, classify
from hcp_tune.job.mcore import parallel_state
from hcp_tune.job.progress import record_step, stop_reason
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec


def _build_attention(spec, backend, groups):
    cp_off = spec.inject_fault == "cp_off"
    packed = spec.packing == "thd"
    if backend == "te":
        from hcp_tune.job.attention.te import TEAttention

        return TEAttention(heads=spec.heads // spec.tp, kv_heads=spec.kv_heads // spec.tp,
                           head_dim=spec.head_dim, groups=groups, comm_type=spec.comm_type,
                           qkv_format="thd" if packed else spec.qkv_format, cp_off=cp_off)
    if packed:
        from hcp_tune.job.attention.packed import build_packed_ref_attention

        return build_packed_ref_attention(groups, spec.comm_type, spec.cp, cp_off=cp_off)
    from hcp_tune.job.attention.reference import build_ref_attention

    return build_ref_attention(groups, spec.comm_type, cp_off=cp_off)


def _no_cp_reference(spec, backend: str, dtype: str):
    """For the same-dtype proof (bf16/fp16): a factory of the same attention over all
    heads, without CP; None for fp32, which is checked against float64."""
    if dtype == "fp32":
        return None  # checked against float64 causal attention instead
    packed = spec.packing == "thd"
    if backend != "te":
        if packed:
            from hcp_tune.job.attention.packed import PackedRefAttention

            return PackedRefAttention  # no groups, parts=1: the whole stream in one process
        from hcp_tune.job.attention.reference import RefHCPAttention

        return RefHCPAttention  # no groups: the whole sequence in one process

    def build():
        from hcp_tune.job.attention.te import TEAttention

        return TEAttention(heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                           groups=None, comm_type="none",
                           qkv_format="thd" if packed else spec.qkv_format)
    return build


def _numerics_error(v: dict) -> str:
    worst = max(v["errors"], key=v["errors"].get)
    return (f"CP result differs from single-process attention: {worst} error "
            f"{v['errors'][worst]:.3g} > tolerance {v['tolerance']:.3g} (is CP communication active?)")


def _measure(spec, attn, device, dtype, rank, t0):
    import torch

    from hcp_tune.job import bench
    from hcp_tune.job.attention.verify import DTYPES

    g = torch.Generator().manual_seed(spec.seed + 1 + rank)
    stream = _stream(spec)
    s_local = (spec.seq if stream is None else stream.tokens) // spec.cp
    hq, hk = spec.heads // spec.tp, spec.kv_heads // spec.tp
    fmt = getattr(attn, "qkv_format", "bshd")
    outer = {"sbhd": (s_local, spec.mbs), "bshd": (spec.mbs, s_local), "thd": (s_local,)}[fmt]
    if stream is not None and fmt == "bshd":
        outer = (1, s_local)  # a packed stream is one sequence: its documents are the batch

    def rnd(h, grad=True):  # created in the attention's own layout: no transpose is timed
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
        (attn(q, k, v) if stream is None else attn(q, k, v, stream)).backward(dout)

    return bench.time_steps(
        step, warmup=spec.warmup_steps, measure=spec.measure_steps, device=device,
        should_stop=lambda: time.monotonic() - t0 > spec.time_limit_s,
        on_step=(lambda i, t: record_step(spec, i, t)) if rank == 0 else None,
        stop_requested=lambda: bool(spec.stop_path) and os.path.exists(spec.stop_path),
    )


def _stream(spec):
    """The trial's packed stream (``attention/packed.py``), or None for fixed length."""
    if spec.packing != "thd":
        return None
    from hcp_tune.job.attention.packed import PackedStream

    return PackedStream.of(spec.packed_docs, spec.cp)


def _packing_record(spec, attn) -> dict:
    """What the result records of a packed trial: its stream and the THD arguments (TE's,
    or for the torch reference what TE would be given: no tensors there)."""
    from hcp_tune.job.attention.packed import stream_record

    stream = _stream(spec)
    thd = getattr(attn, "thd", None) or {"pad_between_seqs": stream.pad_between_seqs,
                                         "cu_seqlens_padded_is_unpadded": None}
    return {"mix": spec.mix, **stream_record(stream), "thd": thd}


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
            spec.mbs, spec.qkv_format, spec.seed, spec.verify_seq, spec.inject_fault,
            spec.packing)  # the packed proof runs its own stream (verify.proof_stream)


def run_trial(spec: TrialSpec, *, env=None, keep_process_group: bool = False,
              pset: Optional[ProcessSet] = None, keep_groups: bool = False) -> TrialResult:
    """Run one trial on this rank; never raises for a trial failure.

    With ``pset`` (a batch), the groups of the previous trial are reused when the layout is
    the same and its proof's verdict is reused; ``keep_groups`` keeps this trial's groups
    for the next one (the caller knows it has the same layout).
    """
    if spec.runner == "bridge":  # a Bridge training run: job/bridge_runner.py
        from hcp_tune.job.bridge.runner import run_bridge_trial

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
        from hcp_tune.job.attention.verify import verify_cp
        from hcp_tune.job.dist import bind_device, detect_env, init_distributed
        from hcp_tune.job.groups import check_groups, init_groups, read_groups

        phases["imports"] = time.monotonic() - t0  # torch and the job modules: once per process
        env = env or detect_env()
        res.job_id = env.job_id
        if env.world_size != spec.world_size:
            raise EnvironmentProblem(
                f"the job started {env.world_size} processes, the trial needs "
                f"tp*cp*dp*pp = {spec.tp}*{spec.cp}*{spec.dp}*{spec.pp} = {spec.world_size}")
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
        parallel_state()  # the module alone (job.mcore), not the whole package
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
            res.error = stop_reason(spec) or str(stop)
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
        res.verification["flops"] = bench.flops_note(spec)
        if spec.packing == "thd":
            res.verification["packing"] = _packing_record(spec, attn)
            res.fingerprint["thd"] = res.verification["packing"]["thd"]
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
