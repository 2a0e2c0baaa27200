"""Cluster profiles: what a layout's placement and the cost model need about a machine.

A profile is one YAML file in ``conf/cluster/`` (or in a folder named by
``HCP_TUNE_CONFIG_PATH``); every figure there carries its public source in a comment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from hcp_tune.config.schema import from_mapping
from hcp_tune.errors import ConfigError

# regress's session spreads where a profile states none: the recorded H200 sessions
# (benchmarks/RESULTS-gpu-recording.md; conf/cluster/dgx-h200.yaml says how they were read)
RECORDED_SESSION_SPREAD = 0.005
RECORDED_LAYOUT_SPREAD = 0.001


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    name: str = field(metadata={"doc": "profile name, as selected with cluster=NAME"})
    device: Literal["cuda", "cpu"] = field(metadata={"doc": "cuda for GPU clusters, cpu for local"})
    gpu_name: str = field(metadata={"doc": "accelerator model, e.g. H100-SXM5-80GB"})
    gpus_per_node: int = field(metadata={"doc": "GPUs (or local CPU ranks) per node"})
    intra_node_bw_gbs: float = field(
        metadata={"doc": "per-GPU unidirectional intra-node bandwidth, GB/s (NVLink)"}
    )
    inter_node_bw_gbs: float = field(
        metadata={"doc": "per-GPU unidirectional inter-node bandwidth, GB/s (IB/RoCE NIC)"}
    )
    peak_bf16_tflops: Optional[float] = field(
        default=None, metadata={"doc": "dense bf16 peak per GPU, TFLOP/s; None on CPU"}
    )
    gpu_memory_gib: float = field(metadata={"doc": "memory per GPU, GiB"})
    intra_node_latency_us: float = 5.0  # per-message latency on NVLink, a few µs (NCCL)
    inter_node_latency_us: float = 10.0  # per-message latency across IB, ~10 µs (NCCL)
    node_aggregate_bw_gbs: Optional[float] = field(default=None, metadata={
        "doc": "GB/s one way that all GPUs of a node can send at once through the node's "
               "shared fabric (PCIe switches, host bridges); null: a full switch fabric "
               "(NVSwitch), where each GPU keeps its own link bandwidth",
        "expect": "a number of GB/s > 0"})
    hbm_bw_gbs: Optional[float] = field(default=None, metadata={
        "doc": "GPU memory bandwidth, GB/s (datasheet); the cost model's ring merge term "
               "needs it, null leaves that term out",
        "expect": "a number of GB/s > 0"})

    host_memory_gib: Optional[float] = field(default=None, metadata={
        "doc": "host (CPU) memory per node, GiB (datasheet); plan warns when a runner=bridge "
               "trial's ranks on one node would pass 90% of it; null: not checked",
        "expect": "a number of GiB > 0"})

    calibration: Optional[str] = field(default=None, metadata={
        "doc": "a calibration shipped with hcp-tune (hcp_tune/costmodel/data/calibrations/"
               "NAME.json) the cost model uses on this cluster; your own calibration "
               "(<results_dir>/calibration/) wins; null: the uncalibrated defaults"})

    session_spread: float = field(default=RECORDED_SESSION_SPREAD, metadata={
        "doc": "relative sd of the shift one session (allocation) gives every layout: what "
               "regress allows between two tags measured in separate sessions; default: the "
               "recorded H200 sessions (benchmarks/RESULTS-gpu-recording.md)",
        "min": 0.0, "expect": "a fraction in [0, 1), e.g. 0.005 (0.5%)"})
    layout_spread: float = field(default=RECORDED_LAYOUT_SPREAD, metadata={
        "doc": "relative sd of each layout's own session effect on top of the shift; "
               "default: the recorded H200 sessions",
        "min": 0.0, "expect": "a fraction in [0, 1), e.g. 0.001 (0.1%)"})

    def __post_init__(self) -> None:
        for name in ("session_spread", "layout_spread"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ConfigError(f"cluster {self.name}: {name}={value}: expected a relative "
                                  "standard deviation, a fraction in [0, 1), e.g. 0.005")
        if self.device == "cuda" and self.peak_bf16_tflops is None:
            raise ConfigError(
                f"cluster {self.name}: peak_bf16_tflops is required for a cuda profile "
                "(it is the ceiling that proves a measured trial is physical)"
            )


def cluster_from_mapping(data: object, name: str) -> ClusterProfile:
    """A profile from a composed ``cluster`` group; ``name`` is the selected option."""
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": name}
    return from_mapping(ClusterProfile, data, "cluster", f"cluster/{name}.yaml")
