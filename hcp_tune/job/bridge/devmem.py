"""A Bridge trial's device memory on one rank: the peak that decides an OOM, sampled during
the steps, and the allocator's retries. torch only (job side), imported lazily.

What the caching allocator sees is ``max_memory_reserved`` (its peak hold from CUDA). What
it cannot see is the CUDA context, NCCL's buffers, cuBLAS workspaces, and anything another
process holds on the same GPU. NVML's "used" counts all of that, but only at the moment it
is read: read once after training it misses the peak. So ``MemorySampler.sample`` runs at
the end of every step (after the recorder's device sync) and keeps the largest "used" and
the largest ``used - reserved`` (memory outside the allocator); the trial's peak is then the
allocator's peak plus that (``measure.BridgeMeasurement.peak_memory``), an upper bound.
``num_alloc_retries`` (``torch.cuda.memory_stats``) counts the times a cudaMalloc failed and
the allocator freed its cache and tried again: a run that fits only by flushing the cache
is near its OOM, and its step times include the flushes.

On CPU (the test double's runs) the figure is the process's peak resident set size.
"""
from __future__ import annotations

from typing import Any, Optional

from hcp_tune.job.bridge.measure import RankMemory


def device_used(device) -> tuple[int, str]:
    """Memory used on the whole device now: NVML through torch (torch >= 2.6), else the
    driver's ``cudaMemGetInfo``."""
    import torch

    try:
        return int(torch.cuda.device_memory_used(device)), "nvml"
    except Exception:  # no pynvml, an NVML error, an older torch
        free, total = torch.cuda.mem_get_info(device)
        return int(total - free), "cudaMemGetInfo"


class MemorySampler:
    """Per-step samples of one rank's device memory; ``read()`` the rank's ``RankMemory``."""

    def __init__(self, rank: int, device: Any) -> None:
        self.rank, self.device = rank, device
        self.used_max: Optional[int] = None
        self.outside_max: Optional[int] = None
        self.source = ""

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def sample(self) -> None:
        if not self.cuda:
            return
        import torch

        used, self.source = device_used(self.device)
        outside = used - int(torch.cuda.memory_reserved(self.device))
        self.used_max = max(used, self.used_max or 0)
        self.outside_max = max(outside, self.outside_max or 0)

    def read(self) -> RankMemory:
        if not self.cuda:
            import resource

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
            return RankMemory(rank=self.rank, device_used=int(rss), device_used_source="ru_maxrss")
        import torch

        self.sample()  # at train end too: a run stopped before its first step has one sample
        stats = torch.cuda.memory_stats(self.device)
        return RankMemory(
            rank=self.rank, max_reserved=int(torch.cuda.max_memory_reserved(self.device)),
            max_allocated=int(torch.cuda.max_memory_allocated(self.device)),
            device_used=self.used_max, device_used_source=f"{self.source}, max of per-step samples",
            outside_allocator=self.outside_max,
            alloc_retries=int(stats.get("num_alloc_retries", 0)))
