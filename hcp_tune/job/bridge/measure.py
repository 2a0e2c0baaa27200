"""Measuring a Bridge training run: a callback that records every step, and a parser of
Bridge's log lines as the fallback.

``StepRecorder`` is a Bridge callback. Megatron-Bridge v0.6.0 (commit 51885cf132b2)
``training/callbacks.py``: ``pretrain(cfg, forward_step, callbacks=[...])`` hands the list
to ``CallbackManager.add``, which registers every ``on_<event>`` method of an object that
is not the base ``Callback``'s own, so a plain class works and this module needs no
Bridge import (tests drive it with plain objects). ``training/train.py`` fires
``on_train_step_start`` before and ``on_train_step_end`` after ``train_step`` (with
``loss_dict``, whose ``"lm loss"`` is ``training/losses.py``'s reporting loss) and
``on_train_end`` after the loop; ``context.state.train_state.floating_point_operations_so_far``
is Bridge's own FLOP count (``flop_utils.num_floating_point_operations`` per step), added
after ``on_train_step_end`` fires.

The log formats (``training/utils/train_utils.py`` at the same commit): the last rank's
``iteration`` line (its throughput field only with ``logger.log_throughput``), rank 0's
``Step Time :`` line, and each data-parallel rank 0's ``[Rank N] (after K iterations)
memory (GB) | ...`` line (gigabytes are 1e9 bytes: ``report_memory``).
"""
from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

GB = 1e9  # Bridge's report_memory divides torch's byte counts by 1e9


@dataclass
class StepRecord:
    step: int  # Bridge's train_state.step while the step ran (0-based)
    time_s: float
    lm_loss: Optional[float]
    skipped: bool = False


@dataclass
class RankMemory:
    """What decides an OOM on one rank, in bytes."""

    rank: int
    max_reserved: Optional[int] = None  # the caching allocator's peak: what it held from CUDA
    max_allocated: Optional[int] = None  # tensors' peak (below reserved)
    device_used: Optional[int] = None  # the whole device (NVML or cudaMemGetInfo), the largest
    # per-step sample: counts the CUDA context, NCCL buffers and other processes' memory too
    device_used_source: str = ""
    # the largest per-step (device used - allocator reserved): what the allocator cannot see
    outside_allocator: Optional[int] = None
    alloc_retries: Optional[int] = None  # torch.cuda.memory_stats num_alloc_retries


@dataclass
class BridgeMeasurement:
    """One Bridge trial's numbers, from callbacks or from its log."""

    source: str  # callbacks | log
    step_times_s: list[float] = field(default_factory=list)  # measured steps only
    lm_losses: list[Optional[float]] = field(default_factory=list)  # every step, in order
    memory: list[RankMemory] = field(default_factory=list)
    flops_per_step: Optional[float] = None  # the whole model, one global batch
    tflops_per_gpu: Optional[float] = None
    world_size: int = 0
    notes: list[str] = field(default_factory=list)

    def peak_memory(self) -> tuple[Optional[int], str]:
        """The largest per-rank figure that decides an OOM, and what it is: the allocator's
        peak plus what it cannot see (``devmem``) where both were read, else the device's
        used memory, else the allocator's peak."""
        both = [m.max_reserved + m.outside_allocator for m in self.memory
                if m.max_reserved is not None and m.outside_allocator is not None]
        if both:
            return max(both), ("torch max_memory_reserved + memory outside the allocator "
                               "(device used - reserved, sampled every step), max over ranks")
        used = [m.device_used for m in self.memory if m.device_used]
        if used:
            src = next(m.device_used_source for m in self.memory if m.device_used)
            return max(used), f"device memory used ({src}), max over ranks"
        reserved = [m.max_reserved for m in self.memory if m.max_reserved]
        if reserved:
            return max(reserved), "torch max_memory_reserved, max over ranks"
        return None, "no memory figure"


def lm_loss(loss_dict: Any) -> Optional[float]:
    """``loss_dict["lm loss"]`` as a float: a scalar tensor, or a (sum, count) pair."""
    if not loss_dict or "lm loss" not in loss_dict:
        return None  # not the last pipeline stage
    value = loss_dict["lm loss"]
    if hasattr(value, "detach"):
        value = value.detach().float().cpu()
        value = value.tolist() if value.numel() > 1 else value.item()
    if isinstance(value, (list, tuple)):
        return float(value[0]) / float(value[1]) if len(value) == 2 and value[1] else None
    return float(value)


class StepRecorder:
    """Bridge callback: per-step wall time with a device sync on both sides, ``lm loss``,
    Bridge's FLOP count, and per-rank memory gathered at train end.

    ``sync`` waits for the device (``torch.cuda.synchronize``); ``clock`` is monotonic;
    ``memory()`` returns this rank's ``RankMemory``; ``gather(obj)`` returns every rank's
    object (``torch.distributed.all_gather_object``: Bridge still holds its process group
    at ``on_train_end``, and destroys it after ``pretrain`` when it created it);
    ``on_measured_step(i, t)`` is told each measured step (progress for early stopping);
    ``sample()`` runs after every step's closing sync (``devmem.MemorySampler.sample``).
    """

    def __init__(self, *, warmup_steps: int, sync: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter,
                 memory: Optional[Callable[[], RankMemory]] = None,
                 gather: Optional[Callable[[Any], list]] = None,
                 on_measured_step: Optional[Callable[[int, float], None]] = None,
                 sample: Callable[[], None] = lambda: None) -> None:
        if warmup_steps < 0:
            raise ValueError(f"StepRecorder: warmup_steps must be >= 0, got {warmup_steps=}")
        self.warmup_steps = warmup_steps
        self.sync, self.clock, self.memory, self.gather = sync, clock, memory, gather
        self.on_measured_step, self.sample = on_measured_step, sample
        self.steps: list[StepRecord] = []
        self.flops_start: Optional[float] = None
        self.flops_end: Optional[float] = None
        self.ranks_memory: list[RankMemory] = []
        self._t0: Optional[float] = None

    @staticmethod
    def _flops_so_far(context: Any) -> Optional[float]:
        ts = getattr(getattr(context, "state", None), "train_state", None)
        value = getattr(ts, "floating_point_operations_so_far", None)
        return float(value) if isinstance(value, (int, float)) else None

    def on_train_start(self, context: Any) -> None:
        self.flops_start = self._flops_so_far(context)

    def on_train_step_start(self, context: Any) -> None:
        self.sync()  # the previous step's kernels are not this step's time
        self._t0 = self.clock()

    def on_train_step_end(self, context: Any) -> None:
        self.sync()
        if self._t0 is None:
            return
        dt, self._t0 = self.clock() - self._t0, None
        self.sample()  # after the clock: sampling is not the step's time
        ts = getattr(getattr(context, "state", None), "train_state", None)
        step = getattr(ts, "step", len(self.steps))
        self.steps.append(StepRecord(step=int(step), time_s=dt,
                                     lm_loss=lm_loss(getattr(context, "loss_dict", None)),
                                     skipped=bool(getattr(context, "skipped_iter", False))))
        measured = len(self.steps) - self.warmup_steps
        if measured > 0 and self.on_measured_step:
            self.on_measured_step(measured - 1, dt)

    def on_train_end(self, context: Any) -> None:
        self.flops_end = self._flops_so_far(context)
        mine = self.memory() if self.memory else None
        self.ranks_memory = [m for m in (self.gather(mine) if self.gather else [mine]) if m]

    def result(self, *, world_size: int, flops_per_step_ported: Optional[float],
               prefer_ported: bool = False) -> BridgeMeasurement:
        """The measurement: Bridge's own FLOP count when it reported one, else the port
        (``prefer_ported``: the port first, for packed trials, where Bridge v0.6.0 counts
        S^2 attention under CP: ``gpt_step._forward_step_common``)."""
        m = BridgeMeasurement(source="callbacks", world_size=world_size,
                              memory=list(self.ranks_memory))
        m.step_times_s = [s.time_s for s in self.steps[self.warmup_steps:]]
        m.lm_losses = [s.lm_loss for s in self.steps]
        n = len(self.steps)
        bridge_count = None
        if self.flops_start is not None and self.flops_end is not None and n:
            bridge_count = (self.flops_end - self.flops_start) / n
        m.flops_per_step = ((flops_per_step_ported or bridge_count) if prefer_ported
                            else (bridge_count or flops_per_step_ported))
        if bridge_count and flops_per_step_ported:
            ratio = bridge_count / flops_per_step_ported
            m.notes.append(f"FLOPs per step: Bridge counted {bridge_count:.4g}, the port "
                           f"{flops_per_step_ported:.4g} (ratio {ratio:.3f})")
        retries = sum(r.alloc_retries or 0 for r in m.memory)
        if retries:
            m.notes.append(f"the CUDA allocator retried {retries} time(s) after a failed cudaMalloc "
                           "(cache flushed): near OOM, and the flushes are in the step times")
        if m.step_times_s and m.flops_per_step and world_size:
            median = statistics.median(m.step_times_s)
            m.tflops_per_gpu = m.flops_per_step / median / world_size / 1e12
        return m


# ---------------------------------------------------------------- the log fallback

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
_STEP_TIME = re.compile(r"Step Time : ([\d.]+)s GPU utilization: ([\d.]+)MODEL_TFLOP/s/GPU")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)(.*)$")


def _fields(tail: str) -> dict[str, str]:
    out = {}
    for part in tail.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _num(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def parse_log(text: str, *, warmup_steps: int, world_size: int) -> BridgeMeasurement:
    """A measurement from Bridge's log lines (log_interval=1): step times and TFLOP/s from
    the iteration lines (steps after the warm-up), losses, per-rank peak memory."""
    m = BridgeMeasurement(source="log", world_size=world_size)
    tflops: list[float] = []
    peak: dict[int, RankMemory] = {}
    for line in text.splitlines():
        it = _ITERATION.search(line)
        if it:
            f = _fields(it.group(3))
            i = int(it.group(1))
            m.lm_losses.append(_num(f.get("lm loss")))
            ms = _num(f.get("elapsed time per iteration (ms)"))
            if i > warmup_steps and ms is not None:
                m.step_times_s.append(ms / 1000.0)
                tf = _num(f.get("throughput per GPU (TFLOP/s/GPU)"))
                if tf is not None:
                    tflops.append(tf)
            continue
        mem = _MEMORY.search(line)
        if mem:
            rank, f = int(mem.group(1)), _fields(mem.group(3))
            rm = peak.setdefault(rank, RankMemory(rank=rank))
            for key, attr in (("mem-max-reserved-gigabytes", "max_reserved"),
                              ("mem-max-allocated-gigabytes", "max_allocated")):
                gb = _num(f.get(key))
                if gb is not None:
                    setattr(rm, attr, max(getattr(rm, attr) or 0, int(gb * GB)))
    m.memory = [peak[r] for r in sorted(peak)]
    if tflops:
        m.tflops_per_gpu = statistics.median(tflops)
    elif m.step_times_s:
        m.notes.append("no throughput field in Bridge's iteration lines (logger.log_throughput "
                       "was off): TFLOP/s not measured from the log")
    return m


def step_time_lines(text: str) -> list[tuple[float, float]]:
    """Rank 0's ``Step Time : 1.23s GPU utilization: 456.7MODEL_TFLOP/s/GPU`` lines."""
    return [(float(a), float(b)) for a, b in _STEP_TIME.findall(text)]
