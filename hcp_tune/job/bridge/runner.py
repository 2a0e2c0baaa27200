"""runner=bridge: one layout measured as a short Megatron-Bridge training run, on every rank.

Order: the training stack is checked first (Megatron-Bridge and Transformer Engine
importable, found without importing them: Bridge's package imports TE) and its absence is
an ``environment`` failure that says which is missing and where the stack comes from ->
the trial's config mapping (``config.bridge_fields``: the whole world tp*cp*dp*pp, mbs and
micro-batches) -> this rank's GPU bound, then Bridge imported (``BridgeStack``: the real
one, or a test double of ``pretrain``) -> the launcher environment exported the way
Bridge's ``initialize`` reads it (``LOCAL_RANK`` the task's own; a task that sees one GPU
tells Bridge through ``dist.external_gpu_device_mapping``: ``device_fields``) -> the real
``ConfigContainer`` -> ``pretrain(cfg, forward_step, callbacks=[fingerprint, guard, stop,
recorder])``: the guard proves at train start that every TE attention module runs the
planned CP groups (``guard``/``verify``), ``control.StopCheck`` ends the loop cleanly on the
stop file or the time limit, the recorder times each step (``measure``); TE's backend
choice is read from its log -> TFLOP/s against the profile's peak. Without Bridge's
callbacks (Bridge < 0.4) it trains without them and parses Bridge's log lines instead, and
says that CP could not be proven. Before the binding, before anything starts CUDA, the
environment the recipes run with and ``CUDA_DEVICE_MAX_CONNECTIONS`` are exported
(``prestart``); at train start the rank placement is checked (``placement``); memory is
sampled at every step (``devmem``). A packed trial (``spec.packing == "thd"``) trains on
its own documents (``packed_data``: Bridge's ``DatasetProvider`` protocol, cu_seqlens as
Bridge's packer builds them) and must also prove, in the first step's forwards, that every
attention module got THD params with the planned CP groups (``thd``), or it is invalid.

One trial per process: ``pretrain`` sets up Megatron's global state (process groups when
it created them, the micro-batch calculator, global timers, ``parallel_state``) for one
run, and tears down only part of it, so a second ``pretrain`` in the same processes could
meet the first one's state. ``job.batch.run_trials`` therefore skips a second Bridge trial in a
batch; the sweep submits each Bridge trial as its own job.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hcp_tune.job.mcore import complete_megatron_core
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

CONTAINER_HINT = ("use the Bridge container (executor.container_image) or executor.setup/"
                  "executor.python; README 'runner=bridge'")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def missing_stack() -> Optional[str]:
    """Which of Transformer Engine and Megatron-Bridge this Python cannot import, or None."""
    missing = [label for module, label in (
        ("transformer_engine", "Transformer Engine (transformer_engine)"),
        ("megatron.bridge", "Megatron-Bridge (megatron.bridge)")) if not _importable(module)]
    if not missing:
        return None
    return (f"runner=bridge: {' and '.join(missing)} not importable by the job's Python "
            f"({sys.executable}, {platform.python_version()}): {CONTAINER_HINT}")


def launcher_env(env) -> dict[str, str]:
    """What Bridge's ``initialize`` reads (torchrun's names) for this rank. ``LOCAL_RANK`` is
    the task's own local rank, never the GPU index: Bridge v0.6.0 (``training/initialize.py``)
    runs Megatron-Core's ``compile_helpers()`` (a ``make`` in site-packages, meant for one
    process per node) on local rank 0 only, so a node's tasks must not all claim 0. Where
    the task sees one GPU, ``device_fields`` says so to Bridge instead."""
    return {"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size),
            "LOCAL_RANK": str(env.local_rank), "MASTER_ADDR": env.master_addr,
            "MASTER_PORT": str(env.master_port)}


def device_fields(local_rank: int, cuda_index: Optional[int]) -> dict[str, Any]:
    """How Bridge finds this rank's GPU, as config fields. Bridge calls
    ``torch.cuda.set_device(LOCAL_RANK)``, or ``set_device(0)`` with
    ``dist.external_gpu_device_mapping`` (``DistributedInitConfig``: "GPU device mapping
    externally managed, e.g. via CUDA_VISIBLE_DEVICES"). ``dist.bind_device`` bound
    ``local_rank % visible``: the local rank itself where the task sees every GPU, GPU 0 where
    it sees its own only (``--gpus-per-task=1``); any other index Bridge cannot be told."""
    from hcp_tune.job.failures import EnvironmentProblem

    if cuda_index is None or cuda_index == local_rank:
        return {}
    if cuda_index == 0:
        return {"dist.external_gpu_device_mapping": True}
    raise EnvironmentProblem(
        f"local rank {local_rank} was bound to cuda:{cuda_index}: Bridge can only use cuda:"
        f"LOCAL_RANK or cuda:0 (dist.external_gpu_device_mapping); give each task all of the "
        "node's GPUs or exactly one (srun --gpus-per-task=1)")


def _nccl_log_path(spec: TrialSpec, env) -> Path:
    """Where NCCL writes this rank's channel set-up: beside the rank's log, else in $TMPDIR."""
    mine = os.environ.get("HCP_TUNE_LOG")
    folder = Path(mine).parent if mine else Path(os.environ.get("TMPDIR") or "/tmp")
    return folder / f"nccl-{spec.trial_id}.rank{env.rank}.log"


def _export_launcher_env(env) -> None:
    os.environ.update(launcher_env(env))


def _gather(obj: Any) -> list:
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def ported_flops(cfg, spec: TrialSpec) -> Optional[float]:
    """Bridge's FLOPs per step for the model as Bridge resolved it (flops.bridge_gpt_flops);
    a packed trial's core attention counted over its documents, ``6*layers*q*sum(d^2)`` a
    sequence instead of ``6*layers*q*seq^2`` (attention never crosses a document)."""
    from hcp_tune.flops import bridge_gpt_flops

    m = cfg.model
    try:
        packed = 0.0
        if spec.packing == "thd" and spec.packed_docs:
            q = (m.kv_channels or m.hidden_size // m.num_attention_heads) * m.num_attention_heads
            docs_sq = sum(sum(d * d for d in s) for s in spec.packed_docs) / len(spec.packed_docs)
            packed = (cfg.train.global_batch_size * 6 * m.num_layers * q
                      * (m.seq_length ** 2 - docs_sq))
        return -packed + bridge_gpt_flops(
            batch=cfg.train.global_batch_size, seq=m.seq_length, layers=m.num_layers,
            hidden=m.hidden_size, ffn_hidden=m.ffn_hidden_size, heads=m.num_attention_heads,
            kv_heads=m.num_query_groups or m.num_attention_heads,
            head_dim=m.kv_channels or m.hidden_size // m.num_attention_heads,
            vocab=m.vocab_size or spec.vocab, tp=m.tensor_model_parallel_size,
            gated_linear_unit=bool(m.gated_linear_unit),
            vocab_divisible_by=m.make_vocab_size_divisible_by)
    except (AttributeError, TypeError, ValueError):
        return None


def last_rank_log(world_size: int) -> Optional[Path]:
    """The last rank's log (Bridge prints its iteration lines there): in a submitit job
    (either executor) that task's stdout; else ``rank<N>.log`` beside ``HCP_TUNE_LOG``."""
    from hcp_tune.job.dist import detect_env, task_paths

    if os.environ.get("SUBMITIT_FOLDER"):
        paths = task_paths(detect_env().job_id, world_size - 1)
        return paths.stdout if paths else None
    mine = os.environ.get("HCP_TUNE_LOG")
    if not mine:
        return None
    return Path(mine).with_name(f"rank{world_size - 1}.log")


class _Fingerprint:
    """Bridge callback: the environment fingerprint, taken at train start while Bridge's
    process group exists, with every rank's host (``job.backend``); then the placement
    check (``placement.check``): a planned intra-node a2a group on several hosts fails the
    trial on every rank alike, before a step is timed."""

    def __init__(self, res: TrialResult, env, device, expected_groups: dict) -> None:
        self.res, self.env, self.device = res, env, device
        self.expected_groups = expected_groups

    def on_train_start(self, context: Any) -> None:
        from hcp_tune.job.backend import fingerprint, rank_hosts
        from hcp_tune.job.bridge import placement

        hosts = rank_hosts()
        self.res.fingerprint = fingerprint(self.env, self.device, hosts=hosts)
        self.res.verification["placement"] = {
            "rank_hosts": hosts, "block": placement.is_block(hosts),
            "problems": placement.placement_problems(self.expected_groups, hosts)}
        placement.check(self.expected_groups, hosts)


@dataclass
class BridgeStack:
    """What a trial takes from Megatron-Bridge: ``pretrain(cfg, forward_step, callbacks=)``,
    the ``forward_step`` it trains with, and the builder of its ``ConfigContainer`` from the
    trial's field mapping. ``real_stack()`` imports Bridge's; tests pass a double of the
    same protocol (tests/job/bridge/pretrain_double.py), which runs on CPU (``needs_cuda``
    False) and names its attention modules (``is_attention``; None: TE's class)."""

    pretrain: Callable[..., Any]
    forward_step: Callable[..., Any]
    build_container: Callable[[dict], Any]
    needs_cuda: bool = True
    is_attention: Optional[Callable[[Any], bool]] = None
    # the GPU's compute capability, read without starting CUDA (prestart.gpu_capability)
    capability: Optional[Callable[[], Optional[tuple[int, int]]]] = None


def real_stack(spec: TrialSpec) -> BridgeStack:
    from hcp_tune.job.attention.te import enable_te_debug_log
    from hcp_tune.job.bridge.config import build_container

    enable_te_debug_log()  # before Bridge imports TE: TE reads it once, at import
    # compute nodes: no downloads, whatever the node had (offline.py); huggingface_hub reads
    # it once, at import, so before Bridge imports it
    os.environ["HF_HUB_OFFLINE"] = "1"
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    return BridgeStack(pretrain=pretrain, forward_step=forward_step,
                       build_container=lambda fields: build_container(fields, spec))


def run_bridge_trial(spec: TrialSpec, *, env=None, stack: Optional[BridgeStack] = None
                     ) -> TrialResult:
    """Run one Bridge trial on this rank; never raises for a trial failure."""
    from hcp_tune.job.failures import EnvironmentProblem, classify

    t0 = time.monotonic()
    res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, world_size=spec.world_size,
                      backend="bridge")
    try:
        if stack is None:
            problem = missing_stack()  # before anything else: nothing below works without them
            if problem:
                raise EnvironmentProblem(problem)
        complete_megatron_core()  # Bridge needs the whole package, not parallel_state alone
        return _run(spec, res, env, stack, t0)
    except Exception as e:  # a failure is a result
        from hcp_tune.job.bridge.guard import HCPNotActiveError

        if isinstance(e, HCPNotActiveError):
            res.status, res.error = Status.INVALID, str(e)
        else:
            res.status = Status.FAILED
            res.failure_class, res.error = classify(e)
        return res
    except SystemExit as e:  # Bridge's train loop exits the process on a signal or duration
        res.status, res.failure_class = Status.FAILED, FailureClass.UNKNOWN
        res.error = f"Bridge called sys.exit({e.code}) during training (exit signal or duration)"
        return res
    finally:
        res.wall_s = time.monotonic() - t0


def _thd_guard(spec: TrialSpec, stack: BridgeStack, guard):
    """Packed trials: the probe of the first forwards and its check (``thd``); else None."""
    if spec.packing != "thd":
        return None
    from hcp_tune.job.bridge.thd import ThdGuard, ThdProbe
    from hcp_tune.job.bridge.verify import _te_attention_class

    is_attention = stack.is_attention
    if is_attention is None:
        te_cls = _te_attention_class()
        is_attention = (lambda m: isinstance(m, te_cls)) if te_cls else (lambda m: False)
    return ThdGuard(guard, ThdProbe(is_attention=is_attention),
                    log=lambda line: print(line, flush=True))


def _bind(env, *, needs_cuda: bool):
    """This rank's device: its GPU bound before any CUDA object (and before Bridge, which
    imports TE, is imported); the CPU for a double."""
    import torch

    from hcp_tune.job.dist import bind_device
    from hcp_tune.job.failures import EnvironmentProblem

    cuda_index = bind_device(env.local_rank)
    if cuda_index is None:
        if needs_cuda:
            raise EnvironmentProblem("runner=bridge needs CUDA (Bridge's initialize asserts "
                                     "it); this node has none")
        return cuda_index, torch.device("cpu")
    return cuda_index, torch.device("cuda", cuda_index)


def _run(spec: TrialSpec, res: TrialResult, env, stack: Optional[BridgeStack],
         t0: float) -> TrialResult:
    import torch

    from hcp_tune.job.attention.te import BackendLog
    from hcp_tune.job.bridge.config import bridge_fields, summary
    from hcp_tune.job.bridge import placement, prestart
    from hcp_tune.job.bridge.devmem import MemorySampler
    from hcp_tune.job.bridge.parity import recipe_parity
    from hcp_tune.job.bridge.control import TIME_LIMIT, StopCheck
    from hcp_tune.job.bridge.guard import HCPGuard
    from hcp_tune.job.bridge.measure import StepRecorder, parse_log
    from hcp_tune.job.dist import detect_env
    from hcp_tune.job.failures import EnvironmentProblem
    from hcp_tune.job.progress import record_step, stop_reason

    env = env or detect_env()
    res.job_id = env.job_id
    if env.world_size != spec.world_size:
        raise EnvironmentProblem(f"the launcher started {env.world_size} processes, the trial "
                                 f"needs tp*cp*dp*pp = {spec.tp}*{spec.cp}*{spec.dp}*{spec.pp} = "
                                 f"{spec.world_size}")
    fields = bridge_fields(spec)  # a bad override fails here, before any device work
    # the recipes' NCCL and allocator settings and CUDA_DEVICE_MAX_CONNECTIONS, before CUDA
    # starts (prestart); NCCL's channel log for the transports (placement)
    capability = (stack.capability if stack and stack.capability else prestart.gpu_capability)()
    wanted = prestart.prestart_env(spec, fields, capability)
    exported = prestart.export(wanted)
    nccl_log = _nccl_log_path(spec, env)
    prestart.export(placement.nccl_log_env(nccl_log, os.environ))
    res.verification["prestart_env"] = {"wanted": wanted, "exported": exported,
                                        "capability": list(capability) if capability else None}
    # the GPU binding first: importing Bridge imports TE, and anything CUDA before the
    # binding would land on GPU 0
    cuda_index, device = _bind(env, needs_cuda=stack is None or stack.needs_cuda)
    fields.update(device_fields(env.local_rank, cuda_index))
    stack = stack or real_stack(spec)
    _export_launcher_env(env)
    res.verification["bridge_config"] = summary(fields)
    parity = recipe_parity(fields)
    if parity.get("not_applied"):
        res.notes.append("scratch mode: the Llama recipes' environment and fusions applied "
                         "except " + ", ".join(parity["not_applied"]))
    cfg = stack.build_container(fields)
    if "recipe" in fields:
        from hcp_tune.job.bridge.offline import last_sources

        res.notes += [f"recipe model config: {line}" for line in last_sources()]
        res.notes += prestart.recipe_env_notes(getattr(cfg, "env_vars", None), exported)

    with_callbacks = "callbacks" in inspect.signature(stack.pretrain).parameters
    collect_fn = None
    if stack.is_attention is not None:
        from hcp_tune.job.bridge.verify import collect

        collect_fn = (lambda model, r: collect(list(model), r, is_attention=stack.is_attention))
    guard = HCPGuard(expected_groups=spec.expected_groups,
                     layout=(spec.comm_type, spec.a2a, spec.p2p),
                     log=lambda line: print(line, flush=True), collect_fn=collect_fn)
    thd = _thd_guard(spec, stack, guard)  # packed: THD and CP proven in the first forwards
    cuda = device.type == "cuda"
    sampler = MemorySampler(env.rank, device)
    recorder = StepRecorder(
        warmup_steps=spec.warmup_steps,
        sync=(lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None),
        memory=sampler.read, gather=_gather, sample=sampler.sample,
        on_measured_step=(lambda i, t: record_step(spec, i, t)) if env.rank == 0 else None)
    stop = StopCheck(stop_path=spec.stop_path, time_limit_s=spec.time_limit_s, t0=t0)
    # TE's backend choice is logged while the model is built and at the first step; the
    # handler goes on first, so TE does not add its own stderr handler on every rank
    te_log = BackendLog().attach()
    try:
        if with_callbacks:
            stack.pretrain(cfg, stack.forward_step, callbacks=[
                _Fingerprint(res, env, device, spec.expected_groups), guard, stop, recorder]
                + ([thd] if thd else []))
        else:
            stack.pretrain(cfg, stack.forward_step)
    finally:
        te_log.detach()
        res.verification["cp_active"] = guard.report or {"checked": False}
        res.fingerprint["bridge_recipe_parity"] = parity
        if thd:  # what TE was handed: recorded with the stack (regress reads fingerprints)
            res.verification["thd"] = thd.report
            res.fingerprint["packed"] = {k: thd.report.get(k) for k in (
                "pad_between_seqs", "pad_between_seqs_set_here", "padded_is_unpadded")}
    res.te_backend = te_log.last
    if res.fingerprint:  # NCCL's transports of this rank's channels (its own log, if written)
        res.fingerprint["nccl_transport"] = placement.read_transports(nccl_log)
    import resource  # this rank's host peak (the loader's pinned batches live here)

    res.verification["host_peak_rss_bytes"] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    if with_callbacks:
        m = recorder.result(world_size=spec.world_size,
                            flops_per_step_ported=ported_flops(cfg, spec),
                            prefer_ported=spec.packing == "thd")
    else:
        log = last_rank_log(spec.world_size)
        if log is None or not log.exists():
            raise EnvironmentProblem("this Bridge has no training callbacks (Bridge >= 0.4 has) "
                                     "and its log could not be found to parse")
        m = parse_log(log.read_text(errors="replace"), warmup_steps=spec.warmup_steps,
                      world_size=spec.world_size)
        res.notes.append("Bridge without callbacks: numbers parsed from its log; CP-active "
                         "could not be proven at train start")
    res.notes += m.notes
    res.step_times_s = m.step_times_s
    res.verification["memory"] = [vars(x) for x in m.memory]
    res.verification["lm_loss"] = m.lm_losses
    res.verification["measured_by"] = m.source
    from hcp_tune.job import bench

    if m.step_times_s:
        stats = bench.summarize(m.step_times_s)
        res.median_s, res.p10_s, res.p90_s = stats["median_s"], stats["p10_s"], stats["p90_s"]
    if stop.stopped:  # the loop was ended early: what was measured is kept, not ranked
        if stop.reason == TIME_LIMIT:
            res.status, res.failure_class = Status.FAILED, FailureClass.TIME_LIMIT
            res.error = (f"runner.time_limit_s={spec.time_limit_s:g} reached at Bridge step "
                         f"{stop.stopped_at} ({len(m.step_times_s)} measured step(s))")
        else:
            res.status = Status.PRUNED
            res.error = stop_reason(spec) or f"stopped at Bridge step {stop.stopped_at}"
        return res
    if not m.step_times_s:
        raise RuntimeError("Bridge ran but no measured step was recorded")
    res.peak_mem_bytes, res.mem_note = m.peak_memory()
    res.flops_per_gpu_step = m.flops_per_step / spec.world_size if m.flops_per_step else None
    res.tflops_per_gpu = m.tflops_per_gpu
    from hcp_tune.flops import BRIDGE_FLOPS_SOURCE

    res.verification["flops"] = BRIDGE_FLOPS_SOURCE
    too_fast = bench.over_peak(res.tflops_per_gpu, spec.peak_tflops)
    if too_fast:
        res.status, res.error = Status.INVALID, too_fast
        return res
    if not with_callbacks:
        res.status, res.error = Status.INVALID, "CP-active not proven (no Bridge callbacks)"
        return res
    if thd and not thd.report.get("checked"):
        res.status, res.error = Status.INVALID, "packed (THD) attention not proven: no step ended"
        return res
    res.status = Status.OK
    return res
