"""Host (CPU) memory of a runner=bridge trial, per rank and per node: an estimate ``plan``
prints, with a warning when a node's ranks would pass ``cluster.host_memory_gib``.

What a Bridge rank holds on the host, by what sets it:

- the process: Python, torch, Transformer Engine and Megatron imports, the CUDA context's
  host side, NCCL's host buffers: ``PROCESS_GIB``, an allowance (not measured here: the
  first GPU session's ``scripts/gpu_check.sh`` step "bridge 32K" prints a rank's real peak
  RSS to replace it);
- the data loader: ``num_workers`` worker processes (``WORKER_GIB`` each), each with
  ``PREFETCH`` batches in flight, plus one batch collated into pinned memory; a batch is
  ``mbs`` samples of ``seq`` tokens: tokens, labels and position ids (int64) and the loss
  mask (float32), ``BYTES_PER_TOKEN``;
- Megatron-Core's mock dataset with ``create_attention_mask=True`` (its default): an S x S
  bool mask per sample, and while one is built two float S x S tensors (8 bytes an entry:
  the peak RSS growth measured in benchmarks/RESULTS-bridge-mask.md)
  (``datasets/gpt_dataset.py``). The Bridge runner turns it off
  (``job.bridge.config.dataset_fields``), so it is not in the estimate; ``with_mask`` is
  what the default would have cost, printed beside it.

Pure arithmetic over the config: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

GIB = 2 ** 30
PROCESS_GIB = 6.0  # an allowance per rank (see the module docstring), not a measurement
WORKER_GIB = 0.5  # one data-loader worker process (forked: its own Python and torch pages)
NUM_WORKERS = 8  # job.bridge.parity.RECIPE_NUM_WORKERS (a test keeps the two equal)
PREFETCH = 2  # torch DataLoader's default prefetch_factor per worker
BYTES_PER_TOKEN = 8 + 8 + 8 + 4  # tokens, labels, position_ids (int64), loss_mask (float32)
NODE_FRACTION = 0.9  # what ranks may use of a node's memory (the OS, page cache, daemons)


@dataclass(frozen=True)
class HostMemory:
    """One rank's host memory, in bytes, by part; ``per_node`` for ``ranks_per_node``."""

    seq: int
    process: float
    workers: float
    batches: float  # every batch in flight in the loader and the pinned one
    mask_per_sample: float  # what create_attention_mask=True would add per sample
    mask_build: float  # and its float temporary while one sample is built
    ranks_per_node: int

    @property
    def per_rank(self) -> float:
        return self.process + self.workers + self.batches

    @property
    def per_node(self) -> float:
        return self.per_rank * self.ranks_per_node

    def with_mask(self, batches_in_flight: int) -> float:
        """Per rank, had the mock data built its S x S mask (Megatron-Core's default)."""
        return self.per_rank + self.mask_per_sample * batches_in_flight + self.mask_build


def estimate(*, seq: int, mbs: int, ranks_per_node: int, num_workers: int = NUM_WORKERS
             ) -> HostMemory:
    """A rank's host memory for micro-batches of ``mbs`` samples of ``seq`` tokens."""
    return HostMemory(
        seq=seq, process=PROCESS_GIB * GIB, workers=num_workers * WORKER_GIB * GIB,
        batches=samples_in_flight(mbs, num_workers) * seq * BYTES_PER_TOKEN,
        mask_per_sample=float(seq) * seq,
        mask_build=8.0 * seq * seq, ranks_per_node=ranks_per_node)


def samples_in_flight(mbs: int, num_workers: int = NUM_WORKERS) -> int:
    """Samples a rank's loader holds at once: each worker's prefetched batches and the
    pinned one."""
    return (num_workers * PREFETCH + 1) * mbs


def plan_host_memory(cfg: Any) -> Optional[dict[str, Any]]:
    """The estimate at the sweep's longest sequence, as ``plan`` prints it (JSON-able), or
    None for the attention runner (no data loader)."""
    if cfg.runner.name != "bridge":
        return None
    tp = max(cfg.tps)
    world = tp * cfg.cp * cfg.dp * cfg.pp
    ranks = min(world, cfg.cluster.gpus_per_node or world)
    est = estimate(seq=max(cfg.seqs), mbs=cfg.mbs, ranks_per_node=ranks)
    limit = getattr(cfg.cluster, "host_memory_gib", None)
    over = limit is not None and est.per_node > NODE_FRACTION * limit * GIB
    return {"seq": est.seq, "per_rank_gib": est.per_rank / GIB, "ranks_per_node": ranks,
            "per_node_gib": est.per_node / GIB, "node_gib": limit,
            "with_mask_per_rank_gib": est.with_mask(samples_in_flight(cfg.mbs)) / GIB,
            "over": over, "text": note(est, limit, cfg.mbs)}


def note(est: HostMemory, limit: Optional[float], mbs: int) -> str:
    """One line: the per-rank parts, the node's total against its memory, the mask's cost."""
    n = samples_in_flight(mbs)
    line = (f"host memory per rank at seq={est.seq} (estimate): {est.process / GIB:.1f} GiB "
            f"process + {est.workers / GIB:.1f} GiB for {NUM_WORKERS} loader workers + "
            f"{est.batches / GIB:.2f} GiB for {n} samples in flight "
            f"({BYTES_PER_TOKEN} B a token; no S x S mask: create_attention_mask=False) = "
            f"{est.per_rank / GIB:.1f} GiB; {est.ranks_per_node} rank(s) a node: "
            f"{est.per_node / GIB:.0f} GiB")
    if limit is None:
        line += " (cluster.host_memory_gib not set: not checked)"
    elif est.per_node > NODE_FRACTION * limit * GIB:
        line += (f" -- WARNING: over {NODE_FRACTION:.0%} of the node's {limit:g} GiB "
                 "(cluster.host_memory_gib): the job may be killed for host memory; fewer "
                 "loader workers (runner.overrides=[dataset.num_workers=2]) or a smaller mbs")
    else:
        line += f" of the node's {limit:g} GiB"
    with_mask = est.with_mask(n) / GIB
    return line + (f"; Megatron-Core's default S x S mask would add "
                   f"{with_mask - est.per_rank / GIB:.0f} GiB a rank")
