"""The cost model's free parameters (``CostParams``: defaults are public rules of thumb,
``calibrate`` fits them, within ``FIT_*``'s bounds) and its result records (``Prediction``,
with its ``MemoryBreakdown`` and the ``Terms`` of the attention core's three sums).
Standard library only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hcp_tune.config.cluster import ClusterProfile

GIB = 1024**3
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
A2A_CALLS_PER_LAYER = 8  # forward Q, K, V, O; backward dO, dQ, dK, dV
# where a fit starts a parameter whose default is 0 (a log-space fit cannot start at 0);
# half_efficiency_heads at its former default, so fits start where they did
FIT_START = {"large_block_tokens": 1e6, "half_efficiency_heads": 0.1,
             "small_message_half_bytes": 1.0, "ring_step_overhead_us": 1e-3,
             "ring_merge_bytes_per_element": 1e-3}
# on a GPU these are fractions of a datasheet figure: a fit keeps them at or below 1 (on a
# CPU the figures are nominal and the fitted factors may exceed 1)
FIT_MAX_GPU = {"compute_efficiency": 1.0, "intra_bw_efficiency": 1.0, "inter_bw_efficiency": 1.0}
# on any device: above 4 heads the term would claim a rank with 4 heads runs at half speed,
# which no kernel does (a fit that goes there uses the term as a stand-in for another effect)
FIT_MAX = {"half_efficiency_heads": 4.0}
FIT_FIELDS = (  # the free parameters calibrate.fit may move
    "compute_efficiency", "intra_bw_efficiency", "inter_bw_efficiency",
    "latency_multiplier", "layer_overhead_us", "half_efficiency_tokens", "large_block_tokens",
    "cpu_share_exponent", "half_efficiency_heads", "small_message_half_bytes",
    "ring_step_overhead_us", "ring_merge_bytes_per_element",
)


@dataclass(frozen=True, kw_only=True)
class CostParams:
    """The model's free parameters: defaults are public rules of thumb, calibration fits them."""

    compute_efficiency: float = 0.5
    """Fraction of the dense peak a causal flash-attention kernel reaches on long blocks.
    FlashAttention-2 reaches 50-73% of A100 peak forward and less backward (Dao 2023);
    FlashAttention-3 about 75% forward on H100 (Shah et al. 2024); TE's CP path splits the
    work into per-step kernels: 0.5 for forward and backward together."""
    other_efficiency: float = 0.6
    """Fraction of peak for the layer's large bf16 GEMMs (typical cuBLAS at these sizes)."""
    intra_bw_efficiency: float = 0.8
    """Achieved / nominal intra-node bandwidth for large NCCL messages (about 80% on NVLink)."""
    inter_bw_efficiency: float = 0.8
    """Achieved / nominal inter-node bandwidth per GPU (NCCL over IB, large messages)."""
    latency_multiplier: float = 1.0
    """Scales the profile's per-message latencies (``intra/inter_node_latency_us``)."""
    half_efficiency_tokens: float = 512.0
    """Block length at which a flash kernel reaches half its long-block efficiency: read
    roughly off FlashAttention-2's causal head_dim-128 curves (1k tokens about 70% of 16k)."""
    large_block_tokens: float = 0.0
    """0: no penalty for long blocks (flash kernels tile, GPU). Else efficiency is divided by
    ``1 + L/large_block_tokens``: a reference kernel that materialises L x L scores (the CPU
    runner) slows once they leave the cache; calibration fits it on CPU."""
    half_efficiency_heads: float = 0.0
    """Heads per rank (after the all-to-all) at which the attention kernel would reach half
    its many-heads efficiency: efficiency is multiplied by ``H/(H + this)``. 0 by default:
    no such loss. A flash kernel's grid is (query tiles x batch x heads) (FlashAttention-2,
    Dao 2023, section 3.2; backward: key tiles), and after the all-to-all a rank holds
    ``heads/(tp*a2a)`` heads of ``seq/p2p`` tokens, so its grid, ``mbs*heads*seq/(tp*cp*128)``
    tiles, its waves and its causal tail are the same for every split of a key: the heads a
    rank holds do not change the kernel's occupancy. (The default was 0.1, which charged 9%
    at one head per rank: it counted heads and batch but not query tiles.) Calibration may
    still fit it, from ``FIT_START``, as a stand-in for an effect the model lacks."""
    small_message_half_bytes: float = 1024.0**2
    """Message size (bytes) at which one all-to-all message reaches half the link
    bandwidth: a message of ``m`` bytes costs ``latency + (m + this)/bandwidth``. NCCL's
    all-to-all over NVLink reaches its bus bandwidth only for per-peer messages of several
    MB; 1 MiB is the order of magnitude of the knee of its published alltoall_perf curves;
    calibration fits it."""
    ring_step_overhead_us: float = 20.0
    """Fixed time of each ring step beyond its attention kernel, on the compute stream:
    launching the step's kernels (attention, output/LSE correction, the send/receive pair;
    4-6 launches of a few µs each on a GPU). On CPU it is the per-step Python and gloo
    overhead, which calibration fits."""
    ring_merge_bytes_per_element: float = 12.0
    """Memory traffic per output element when a ring step folds its partial result into the
    running one: fp32 accumulator read and write (8 B), the step's bf16 output (2 B), LSE
    and rescale factors (about 2 B). Divided by the profile's ``hbm_bw_gbs``; no term when
    the profile has none (CPU). Unfused PyTorch merges move several times more."""
    layer_overhead_us: float = 50.0
    """Fixed time per layer forward+backward: kernel launches, small ops (GPU, order of
    magnitude); on CPU the Python and process overhead, which calibration fits."""
    cpu_core_gflops: float = 10.0
    """CPU profiles have no peak: a nominal fp32 GFLOP/s per core, to be calibrated."""
    cpu_share_exponent: float = 1.0
    """CPU only: with more ranks than cores each rank gets ``(cores/ranks)**exponent`` of a
    core; 1 is a fair share, above 1 models the cycles lost to ranks busy-waiting in gloo
    collectives and to context switches when the machine is oversubscribed."""
    cpu_cores: int = 0
    """Cores the CPU ranks share (0: this machine's ``os.cpu_count()``)."""
    source: str = "uncalibrated defaults"
    """Where the numbers come from: defaults, or ``calibrated <date> <cluster>/<env_tag>``."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("cpu_cores", "layer_overhead_us", "large_block_tokens",
                          "half_efficiency_heads", "small_message_half_bytes",
                          "ring_step_overhead_us", "ring_merge_bytes_per_element"):
                if value < 0:
                    raise ValueError(f"CostParams: {f.name} must be >= 0, but got {value=}.")
            elif f.name != "source" and not value > 0:
                raise ValueError(f"CostParams: {f.name} must be > 0, but got {value=}.")

    @property
    def calibrated(self) -> bool:
        return self.source.startswith("calibrated")

    def replace(self, **changes) -> "CostParams":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class Terms:
    """Where the time goes inside ``compute_s``, ``exposed_a2a_s`` and ``exposed_p2p_s``
    (seconds, same scope as the ``Prediction``): the three sums are exactly
    ``compute_s = compute_ideal_s + compute_short_block_s + compute_few_heads_s +
    compute_imbalance_s``,
    ``exposed_a2a_s = a2a_volume_s + a2a_messages_s + a2a_shared_link_s`` and
    ``exposed_p2p_s = ring_transfer_s + ring_step_overhead_s``."""

    compute_ideal_s: float = 0.0  # FLOPs at the long-block, many-heads efficiency
    compute_short_block_s: float = 0.0  # extra: a ring step's kernel sees a short block
    compute_few_heads_s: float = 0.0  # extra: few heads per rank after the all-to-all
    compute_imbalance_s: float = 0.0  # extra: packed documents load the a2a groups unevenly
    a2a_volume_s: float = 0.0  # (N-1)/N of each tensor at the rank's own link bandwidth
    a2a_messages_s: float = 0.0  # N-1 messages per collective: latency + small-message cost
    a2a_shared_link_s: float = 0.0  # extra when the node's aggregate bandwidth caps each rank
    ring_transfer_s: float = 0.0  # K/V (dK/dV) transfers not hidden behind compute
    ring_step_overhead_s: float = 0.0  # per ring step: kernel launches + merging partial results

    def scaled(self, k: float) -> "Terms":
        return Terms(**{f.name: k * getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Per-rank memory in GiB."""

    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    a2a_buffers_gib: float
    p2p_buffers_gib: float

    @property
    def total_gib(self) -> float:
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """A predicted step: ``step_time_s = compute_s + exposed_a2a_s + exposed_p2p_s + other_s
    + recompute_s + bubble_s + pp_send_s`` (the last three are 0 with pp=1 and no recompute)."""

    step_time_s: float
    compute_s: float  # attention core compute (a stage's layers, every micro-batch, fwd+bwd)
    exposed_a2a_s: float  # all-to-all time (never hidden)
    exposed_p2p_s: float  # ring time not hidden behind compute
    other_s: float  # GEMMs, TP collectives, per-layer overhead: the same for every layout
    memory_gib: float
    memory: MemoryBreakdown
    terms: Terms = field(default_factory=Terms)  # the sums above, term by term
    recompute_s: float = 0.0  # forward passes run again in backward (activation recompute)
    bubble_s: float = 0.0  # 1F1B: (pp-1) idle micro-batch slots of the busiest stage
    pp_send_s: float = 0.0  # activations / gradients sent between pipeline stages
    label: str = "predicted"

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["memory"] = {**out["memory"], "total_gib": self.memory.total_gib}
        return out


def label_for(cluster: ClusterProfile, params: CostParams) -> str:
    if params.calibrated:
        return f"predicted ({params.source})"
    if cluster.peak_bf16_tflops is None:
        return f"predicted (uncalibrated; CPU nominal {params.cpu_core_gflops:g} GFLOP/s/core)"
    return "predicted (uncalibrated defaults)"
