"""Analytical cost model: predicted step time and memory of one HCP layout on a cluster.

What belongs here: the formulas, their free parameters (``CostParams``) and the result
records (``Prediction``). Standard library only; no torch, no files (``calibrate`` fits and
stores the parameters, ``predict`` makes tables). All times are per rank, in seconds.

One training step (``predict``) = ``layers`` x the attention core of a layer (below) +
the rest (``other_s``: GEMMs, TP collectives, per-layer overhead), which does not depend
on ``[a2a, p2p]``. The attention core of one layer, forward and backward
(``predict_attention_layer``; the attention runner measures exactly this):

- compute: causal FLOPs (``flops.causal_attention_flops``) / (tp*cp) ranks (load-balanced
  chunks split the work evenly), at ``peak x compute_efficiency x L/(L + half_efficiency_tokens)``
  where ``L = seq/p2p`` is the query/key length of one ring step's kernel: short blocks run
  a flash kernel less efficiently, which is why pure ring loses at short chunks
  (hcp-facts.md section 6).
- all-to-all over the a2a group (never overlapped): forward Q, K, V in and O back,
  backward dO in and dQ, dK, dV back; each rank sends ``(a-1)/a`` of each tensor, at the
  intra- or inter-node bandwidth by where the a2a group sits (``RankGroups``), plus one
  latency per collective.
- ring over the p2p group: forward ``p-1`` steps that each cost ``max(compute_step,
  send K/V block)`` and a last step of compute only; backward the same with K/V and dK/dV
  blocks, plus the un-overlapped hand-back of the last dK/dV block to its owner. A message
  costs latency + bytes / bandwidth of the slowest link the ring crosses. What exceeds the
  pure compute is the exposed p2p time.

Memory per rank (GiB): bf16 weights and fp32 gradients over TP, fp32 master weights and
Adam moments (12 B/param) sharded over dp*cp (Megatron's distributed optimizer shards
over the data-parallel-with-CP group), activations of the local ``seq/cp`` tokens for
all layers (sequence parallel over TP, flash attention: no seq^2 term, no recompute),
fp32 logits, one layer's a2a send/receive buffers and the ring's double-buffered K/V and
dK/dV blocks. Gradient reduce-scatter / parameter all-gather of the distributed optimizer
are assumed overlapped with backward/forward and are not counted.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from hcp_tune.cluster import ClusterProfile
from hcp_tune.flops import causal_attention_flops, layer_gemm_flops, lm_head_flops
from hcp_tune.layout import Candidate, layout_facts, rank_groups
from hcp_tune.model import ModelSpec
from hcp_tune.rules import LAYOUT_RULES, evaluate

GIB = 1024**3
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
A2A_CALLS_PER_LAYER = 8  # forward Q, K, V, O; backward dO, dQ, dK, dV
FIT_START = {"large_block_tokens": 1e6}  # where a fit starts a parameter whose default is 0
FIT_FIELDS = (  # the free parameters calibrate.fit may move
    "compute_efficiency", "intra_bw_efficiency", "inter_bw_efficiency",
    "latency_multiplier", "layer_overhead_us", "half_efficiency_tokens", "large_block_tokens",
    "cpu_share_exponent",
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
            if f.name in ("cpu_cores", "layer_overhead_us", "large_block_tokens"):
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
    """A predicted step: ``step_time_s = compute_s + exposed_a2a_s + exposed_p2p_s + other_s``."""

    step_time_s: float
    compute_s: float  # attention core compute (all layers, forward and backward)
    exposed_a2a_s: float  # all-to-all time (never hidden)
    exposed_p2p_s: float  # ring time not hidden behind compute
    other_s: float  # GEMMs, TP collectives, per-layer overhead: the same for every layout
    memory_gib: float
    memory: MemoryBreakdown
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


def _ranks_on_node(cand: Candidate, cluster: ClusterProfile) -> int:
    world = cand.tp * cand.cp * cand.dp
    return max(1, min(world, cluster.gpus_per_node))


def peak_flops(cluster: ClusterProfile, params: CostParams, dtype: str, ranks_on_node: int) -> float:
    """Peak FLOP/s one rank can use: the profile's dense bf16 peak (half of it for fp32, i.e.
    TF32), or on CPU the nominal per-core rate times the cores each rank gets."""
    if cluster.peak_bf16_tflops is not None:
        return cluster.peak_bf16_tflops * 1e12 * (0.5 if dtype == "fp32" else 1.0)
    cores = params.cpu_cores or os.cpu_count() or 1
    share = min(1.0, cores / ranks_on_node) ** params.cpu_share_exponent
    return params.cpu_core_gflops * 1e9 * share


def _link(cluster: ClusterProfile, params: CostParams, crosses: bool) -> tuple[float, float]:
    """(bytes/s, latency s) of one link kind."""
    if crosses:
        return (cluster.inter_node_bw_gbs * 1e9 * params.inter_bw_efficiency,
                cluster.inter_node_latency_us * 1e-6 * params.latency_multiplier)
    return (cluster.intra_node_bw_gbs * 1e9 * params.intra_bw_efficiency,
            cluster.intra_node_latency_us * 1e-6 * params.latency_multiplier)


def _groups(cand: Candidate, cluster: ClusterProfile):
    if cand.groups is not None:
        return cand.groups
    return rank_groups(cand.layout, tp=cand.tp, dp=cand.dp, gpus_per_node=cluster.gpus_per_node)


@dataclass(frozen=True)
class _Attention:
    compute_s: float
    a2a_s: float
    p2p_s: float
    qkvo_bytes: float  # Q + K + V of the local chunk (a2a send buffer of one direction)
    kv_block_bytes: float  # one ring K/V block


def _attention(model, cluster, cand, mbs, dtype, params) -> _Attention:
    a, p, tp, cp, seq = cand.layout.a2a, cand.layout.p2p, cand.tp, cand.cp, cand.seq
    b = DTYPE_BYTES[dtype]
    groups = _groups(cand, cluster)
    fwd, bwd = causal_attention_flops(seq, model.heads, model.head_dim, mbs)
    block_tokens = seq / p
    eff = params.compute_efficiency * block_tokens / (block_tokens + params.half_efficiency_tokens)
    if params.large_block_tokens:
        eff /= 1 + block_tokens / params.large_block_tokens
    rate = peak_flops(cluster, params, dtype, _ranks_on_node(cand, cluster)) * eff
    comp_f, comp_b = fwd / (tp * cp) / rate, bwd / (tp * cp) / rate

    local_tokens = mbs * seq / cp
    q_bytes = local_tokens * model.heads / tp * model.head_dim * b
    kv_bytes = local_tokens * model.kv_heads / tp * model.head_dim * b  # K or V
    a2a_s = 0.0
    if a > 1:
        bw, lat = _link(cluster, params, groups.a2a_crosses_nodes)
        moved = (a - 1) / a * 2 * (2 * q_bytes + 2 * kv_bytes)  # fwd Q,K,V,O; bwd dO,dQ,dK,dV
        a2a_s = moved / bw + A2A_CALLS_PER_LAYER * lat

    # after the all-to-all a rank holds seq/p tokens of heads/(tp*a): a K+V block is
    # 2 * mbs * seq/p * kv_heads/(tp*a) * head_dim * bytes (= K+V of the local chunk)
    kv_block = 2 * mbs * (seq / p) * model.kv_heads / (tp * a) * model.head_dim * b
    p2p_s = 0.0
    if p > 1:
        bw, lat = _link(cluster, params, groups.p2p_crosses_nodes)
        step_f, step_b = comp_f / p, comp_b / p
        send_kv = lat + kv_block / bw
        send_kv_dkv = lat + 2 * kv_block / bw
        ring_f = (p - 1) * max(step_f, send_kv) + step_f
        ring_b = (p - 1) * max(step_b, send_kv_dkv) + step_b + send_kv  # last dK/dV home
        p2p_s = ring_f + ring_b - comp_f - comp_b
    return _Attention(comp_f + comp_b, a2a_s, p2p_s, q_bytes + 2 * kv_bytes, kv_block)


def _buffers_gib(cand: Candidate, att: _Attention) -> tuple[float, float]:
    a2a = 2 * att.qkvo_bytes if cand.layout.a2a > 1 else 0.0  # send + receive, one layer
    p2p = 4 * att.kv_block_bytes if cand.layout.p2p > 1 else 0.0  # K/V and dK/dV, 2 buffers
    return a2a / GIB, p2p / GIB


def predict_attention_layer(
    model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, *, mbs: int = 1,
    dtype: str = "bf16", params: CostParams = CostParams(),
) -> Prediction:
    """One attention layer's core, forward and backward (what ``runner=attention`` measures).

    ``other_s`` is the fixed per-layer overhead; memory is the layer's Q/K/V/O and buffers.
    """
    _check(model, cluster, candidate, mbs, dtype)
    att = _attention(model, cluster, candidate, mbs, dtype, params)
    other = params.layer_overhead_us * 1e-6
    a2a_gib, p2p_gib = _buffers_gib(candidate, att)
    acts = (att.qkvo_bytes + att.qkvo_bytes * model.heads / (model.heads + 2 * model.kv_heads))
    mem = MemoryBreakdown(weights_gib=0.0, grads_gib=0.0, optimizer_gib=0.0,
                          activations_gib=acts / GIB, a2a_buffers_gib=a2a_gib,
                          p2p_buffers_gib=p2p_gib)
    return Prediction(
        step_time_s=att.compute_s + att.a2a_s + att.p2p_s + other, compute_s=att.compute_s,
        exposed_a2a_s=att.a2a_s, exposed_p2p_s=att.p2p_s, other_s=other,
        memory_gib=mem.total_gib, memory=mem, label=label_for(cluster, params),
    )


def predict(
    model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, *, mbs: int = 1,
    dtype: str = "bf16", params: CostParams = CostParams(),
) -> Prediction:
    """One full training step (forward, backward, all layers) of ``candidate`` on ``cluster``."""
    _check(model, cluster, candidate, mbs, dtype)
    att = _attention(model, cluster, candidate, mbs, dtype, params)
    L, tp, cp, b = model.layers, candidate.tp, candidate.cp, DTYPE_BYTES[dtype]
    tokens = mbs * candidate.seq / cp
    ranks_on_node = _ranks_on_node(candidate, cluster)

    gemm_fwd = L * layer_gemm_flops(tokens, model.hidden, model.ffn_hidden, model.heads,
                                    model.kv_heads, model.head_dim)
    gemm_fwd += lm_head_flops(tokens, model.hidden, model.vocab)
    gemm_s = 3 * gemm_fwd / tp / (peak_flops(cluster, params, dtype, ranks_on_node)
                                  * params.other_efficiency)
    tp_s = 0.0
    if tp > 1:  # sequence parallel: 2 all-gathers + 2 reduce-scatters forward, same backward
        bw, lat = _link(cluster, params, tp > cluster.gpus_per_node)
        tp_s = L * 8 * ((tp - 1) / tp * tokens * model.hidden * b / bw + lat)
    other = gemm_s + tp_s + L * params.layer_overhead_us * 1e-6

    n = model.params / tp
    per_token = 4 * model.hidden + (2 * model.heads + 2 * model.kv_heads) * model.head_dim \
        + 3 * model.ffn_hidden  # saved elements per token per layer (LN/GEMM inputs, QKV, O, MLP)
    acts = L * tokens * per_token / tp * b + tokens * model.vocab / tp * 4  # + fp32 logits
    a2a_gib, p2p_gib = _buffers_gib(candidate, att)
    mem = MemoryBreakdown(
        weights_gib=n * b / GIB, grads_gib=n * 4 / GIB,
        optimizer_gib=n * 12 / (candidate.dp * cp) / GIB, activations_gib=acts / GIB,
        a2a_buffers_gib=a2a_gib, p2p_buffers_gib=p2p_gib,
    )
    compute, a2a, p2p = L * att.compute_s, L * att.a2a_s, L * att.p2p_s
    return Prediction(
        step_time_s=compute + a2a + p2p + other, compute_s=compute, exposed_a2a_s=a2a,
        exposed_p2p_s=p2p, other_s=other, memory_gib=mem.total_gib, memory=mem,
        label=label_for(cluster, params),
    )


def _check(model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, mbs: int,
           dtype: str) -> None:
    """Preconditions: known dtype, mbs >= 1, and a layout no HCP rule rejects (rules.py)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if mbs < 1:
        raise ValueError(f"mbs must be >= 1, but got {mbs=}.")
    facts = layout_facts(model, cluster, candidate.layout, tp=candidate.tp, seq=candidate.seq)
    errors = [f for f in evaluate(facts, LAYOUT_RULES) if f.severity == "error"]
    if errors:
        raise ValueError(f"{errors[0].text} (the cost model predicts only legal layouts: see plan)")
