"""Timing, FLOPs and peak memory of the attention step.

FLOPs convention (causal self-attention, one layer, forward + backward):

- forward  = 4 * mbs * seq^2 * heads * head_dim / 2: two matmuls (QK^T and PV) of
  2 * seq^2 * head_dim FLOPs per head, halved by the causal mask;
- backward = 2.5 * forward (the FlashAttention papers' convention: 5 matmuls, one of them
  recomputing QK^T, counted as 2.5x the forward);
- per GPU = total / (cp * tp): CP splits the sequence work, TP the heads.
- packed sequences (THD): attention runs within each document, so ``seq^2`` becomes
  ``sum(d^2)`` over the documents' real lengths (``flops.packed_attention_flops``); padding
  does no model work. Counting ``S^2`` there would inflate the achieved rate several-fold
  and hide a layout beating physics.

So a step's model FLOPs are 3.5 * forward. Softmax and elementwise work are not counted,
as usual; the achieved rate is model FLOPs per GPU divided by the median step time.

Timing: warm-up steps are discarded (allocator, communicators, kernel selection); every
measured step after them is the steady window, and the trial's statistic is the median of
that window (``summarize``; ``regress`` compares these per-trial medians). Before
each step all ranks meet in a tiny all-reduce that also carries the stop flag (rank 0's
time limit), so every rank agrees when to stop; it sits outside the timed region. Each
step is timed with device synchronisation (CUDA events on GPU, perf_counter on CPU); the
step time is the slowest rank's, taken with one all-reduce(MAX) at the end.

Memory: on CUDA ``torch.cuda.max_memory_allocated`` over the measured steps (bytes, this
rank; the maximum over ranks is reported). On CPU memory is **not measured** (None, with
the reason in ``mem_note``): the only per-process figure, the peak resident set size
(``ru_maxrss``), only rises within a process, so every trial after the first of a batch
would read 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from hcp_tune.flops import causal_attention_flops, packed_attention_flops
from hcp_tune.noise import percentile


def attention_flops(*, seq: int, heads: int, head_dim: int, mbs: int = 1) -> dict[str, float]:
    """Model FLOPs of one causal attention layer for the whole sequence (all GPUs); the
    formula is the one the cost model uses (``hcp_tune/flops.py``)."""
    fwd, bwd = causal_attention_flops(seq, heads, head_dim, mbs)
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def flops_per_gpu(spec) -> float:
    if spec.packing == "thd":
        docs = [d for sequence in spec.packed_docs for d in sequence]
        total = sum(packed_attention_flops(docs, spec.heads, spec.head_dim))
    else:
        total = attention_flops(seq=spec.seq, heads=spec.heads, head_dim=spec.head_dim,
                                mbs=spec.mbs)["total"]
    return total / (spec.cp * spec.tp)


def flops_note(spec) -> str:
    """How ``flops_per_gpu`` counted this trial (the result's ``verification["flops"]``)."""
    work = ("sum(d^2) over the packed documents' real lengths"
            if spec.packing == "thd" else "mbs*seq^2")
    return (f"causal attention fwd = 4*{work}*heads*head_dim/2, bwd = 2.5*fwd "
            "(FlashAttention convention), per GPU = total/(cp*tp)")


def summarize(times: list[float]) -> dict[str, float]:
    return {"median_s": percentile(times, 50), "p10_s": percentile(times, 10),
            "p90_s": percentile(times, 90), "steps": len(times)}


@dataclass
class Timing:
    step_times_s: list[float]
    peak_mem_bytes: Optional[int]  # None: not measured (CPU)
    mem_note: str
    warmup_s: float = 0.0  # wall time of the warm-up steps (with their agreement collectives)


CPU_MEM_NOTE = ("not measured on CPU: peak RSS (ru_maxrss) only rises within a process, "
                "so later trials of a batch would read 0")


class TimeLimitReached(RuntimeError):
    pass


class StopRequested(RuntimeError):
    """The orchestrator asked this trial to stop (its stop file): not a failure of the
    processes, which stay usable for the batch's next trial. ``steps`` are the measured
    step times this rank had when all ranks agreed to stop."""

    def __init__(self, message: str, steps: list[float]) -> None:
        super().__init__(message)
        self.steps = steps


def time_steps(step: Callable[[int], None], *, warmup: int, measure: int, device,
               should_stop: Callable[[], bool], on_step: Callable[[int, float], None] = None,
               stop_requested: Callable[[], bool] = lambda: False) -> Timing:
    """Run warm-up + measured steps; ``step(i)`` runs one forward+backward (i counts all).

    Before every step the ranks agree (one all-reduce) on whether to go on: ``should_stop``
    (the time limit) raises ``TimeLimitReached``, ``stop_requested`` (the orchestrator's
    stop file) ``StopRequested`` with the measured steps so far."""
    cuda = device.type == "cuda"
    times = []
    flag = torch.zeros(1, device=device)
    began, warmup_s = time.perf_counter(), 0.0
    for i in range(warmup + measure):
        if i == warmup:
            warmup_s = time.perf_counter() - began
        flag.fill_(2.0 if stop_requested() else 1.0 if should_stop() else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # barrier + agreed stop
        if flag.item() > 1:
            raise StopRequested(f"stopped after {i} of {warmup + measure} steps", list(times))
        if flag.item() > 0:
            raise TimeLimitReached(f"time limit reached after {i} of {warmup + measure} steps")
        if cuda and i == warmup:
            torch.cuda.reset_peak_memory_stats(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(i)
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            step(i)
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
            if on_step is not None:
                on_step(i - warmup, elapsed)
    slowest = torch.tensor(times or [0.0], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if not cuda:
        return Timing([float(t) for t in slowest.tolist()][: len(times)], None,
                      CPU_MEM_NOTE, warmup_s)
    peak = torch.tensor([float(torch.cuda.max_memory_allocated(device))], dtype=torch.float64,
                        device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    note = "torch.cuda.max_memory_allocated over the measured steps, max over ranks"
    return Timing([float(t) for t in slowest.tolist()][: len(times)], int(peak.item()), note,
                  warmup_s)


def over_peak(tflops_per_gpu: Optional[float], peak_tflops: Optional[float]) -> Optional[str]:
    """Why a measurement beats physics (the second symptom of CP off), or None."""
    if tflops_per_gpu is None or not peak_tflops or tflops_per_gpu <= peak_tflops:
        return None
    return (f"achieved {tflops_per_gpu:.1f} TFLOP/s per GPU exceeds the hardware peak "
            f"{peak_tflops:.1f}: CP cannot be doing the full work")
