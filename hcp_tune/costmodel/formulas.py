"""Analytical cost model: predicted step time and memory of one HCP layout on a cluster.

What belongs here: the formulas, their free parameters (``CostParams``) and the result
records (``Prediction``). Standard library only; no torch, no files (``calibrate`` fits and
stores the parameters, ``predict`` makes tables). All times are per rank, in seconds.

One training step (``predict``) = ``layers`` x the attention core of a layer (below) +
the rest (``other_s``: GEMMs, TP collectives, per-layer overhead), which does not depend
on ``[a2a, p2p]``. The attention core of one layer, forward and backward
(``predict_attention_layer``; the attention runner measures exactly this):

- compute: causal FLOPs (``flops.causal_attention_flops``) / (tp*cp) ranks (load-balanced
  chunks split the work evenly), at ``peak x compute_efficiency x L/(L + half_efficiency_tokens)
  x H/(H + half_efficiency_heads)`` where ``L = seq/p2p`` is the query/key length of one
  ring step's kernel (short blocks run a flash kernel less efficiently: why pure ring loses
  at short chunks, hcp-facts.md section 6) and ``H = heads/(tp*a2a)`` the heads a rank
  holds after the all-to-all (no loss by default: see ``half_efficiency_heads``).
- all-to-all over the a2a group (never overlapped): forward Q, K, V in and O back,
  backward dO in and dQ, dK, dV back. One all-to-all of ``V`` bytes per rank over ``N``
  ranks is ``N-1`` messages of ``V/N``, all ranks at once, each costing ``latency +
  (V/N + small_message_half_bytes)/bw``. A group inside a node uses the intra-node link,
  capped at the profile's ``node_aggregate_bw_gbs`` shared by the node's ranks (PCIe
  nodes). A group spanning ``k`` nodes (``RankGroups``: Megatron puts it there when
  tp*a2a > GPUs per node) sends the ``(k-1)/k`` share of ``V`` to the peers on other nodes
  over the inter-node link (per GPU in the profiles: the node's NICs shared by its GPUs,
  which all send at once) with the inter-node latency per peer, and the rest over the
  intra-node link at the same time; the slower part sets the time.
- ring over the p2p group: forward ``p-1`` steps that each cost ``max(compute_step +
  step overhead, send K/V block)`` and a last step of compute only; backward the same with
  K/V and dK/dV blocks, plus the un-overlapped hand-back of the last dK/dV block to its
  owner. A message costs latency + bytes / bandwidth of the slowest link the ring crosses
  (a neighbour's link: the node aggregate does not cap a ring). The step overhead (kernel
  launches, merging the step's partial output at the profile's ``hbm_bw_gbs``) runs on
  the compute stream. What exceeds the pure compute is the exposed p2p time.
- ``Terms`` splits the three sums into these parts for the user's breakdown;
  ``forward_only`` keeps the forward pass alone (published inference-style tables).

Pipeline and recompute (pipeline.py): a stage holds ``layers/pp`` layers; a step runs
``m = gbs/(mbs*dp)`` micro-batches through the 1F1B schedule, ``m`` slots of work plus
``pp-1`` idle slots (the bubble) of the busiest stage (its layers plus the output layer),
plus two sends of ``seq/cp x hidden/tp`` activations per micro-batch between stages.

Memory per rank (GiB), of the stage that needs most: bf16 weights and fp32 gradients of
the stage's parameters over TP, fp32 master weights and Adam moments (12 B/param) sharded
over dp*cp (Megatron's distributed optimizer shards over the data-parallel-with-CP group),
activations of the local ``seq/cp`` tokens for the stage's layers (sequence parallel over
TP, flash attention: no seq^2 term; less with recompute) times the micro-batches the first
stage keeps in flight (``min(pp, m)``), fp32 logits on the last stage, one layer's a2a send/receive buffers and the ring's double-buffered K/V and
dK/dV blocks. Gradient reduce-scatter / parameter all-gather of the distributed optimizer
are assumed overlapped with backward/forward and are not counted.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.flops import causal_attention_flops, layer_gemm_flops, lm_head_flops
from hcp_tune.space.layout import Candidate, layout_facts, rank_groups
from hcp_tune.upstream.pipeline import (
    FORWARD_SHARE,
    Recompute,
    in_flight,
    recomputed_layers,
    saved_activations,
    stage_layers,
)
from hcp_tune.upstream.rules import LAYOUT_RULES, evaluate

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
    ``compute_s = compute_ideal_s + compute_short_block_s + compute_few_heads_s``,
    ``exposed_a2a_s = a2a_volume_s + a2a_messages_s + a2a_shared_link_s`` and
    ``exposed_p2p_s = ring_transfer_s + ring_step_overhead_s``."""

    compute_ideal_s: float = 0.0  # FLOPs at the long-block, many-heads efficiency
    compute_short_block_s: float = 0.0  # extra: a ring step's kernel sees a short block
    compute_few_heads_s: float = 0.0  # extra: few heads per rank after the all-to-all
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


def _ranks_on_node(cand: Candidate, cluster: ClusterProfile) -> int:
    world = cand.tp * cand.cp * cand.dp * cand.pp
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
    return rank_groups(cand.layout, tp=cand.tp, dp=cand.dp, pp=cand.pp,
                       gpus_per_node=cluster.gpus_per_node)


@dataclass(frozen=True)
class _Attention:
    compute_s: float
    a2a_s: float
    p2p_s: float
    qkvo_bytes: float  # Q + K + V of the local chunk (a2a send buffer of one direction)
    kv_block_bytes: float  # one ring K/V block
    terms: Terms


def _a2a(volumes: list[float], n: int, local: int, intra: tuple[float, float, float],
         inter: tuple[float, float], params: "CostParams") -> tuple[float, float, float]:
    """(volume, messages, shared-link) seconds of one all-to-all per tensor in ``volumes``
    (bytes each rank holds) over ``n`` ranks, ``local`` of them on each node (``n`` when the
    group stays inside a node): each rank sends ``n-1`` messages of ``V/n``, all ranks at
    once, ``local-1`` of them over the intra-node link and ``n-local`` (the share
    ``(k-1)/k`` of ``V`` for a group spanning ``k`` nodes) over the inter-node link. A
    message costs ``lat + (V/n + m_half)/bw``: the per-message latency, and a small
    message reaches ``m/(m + m_half)`` of the link bandwidth. ``intra`` is (bandwidth,
    capped bandwidth, latency): the capped bandwidth (<= bandwidth) is what each rank gets
    when the node's fabric is shared. ``inter`` is (bandwidth, latency) of one rank's share
    of the node's network links: the profiles give it per GPU (a NIC per GPU), and every
    rank of the node sends across at once. The two parts use different links and run at
    once: one all-to-all takes as long as the slower part, whose terms are returned."""
    bw_in, capped, lat_in = intra
    bw_out, lat_out = inter
    volume = messages = shared = 0.0
    for v in volumes:
        peers_in, peers_out = local - 1, n - local
        vol_in, vol_out = peers_in / n * v / bw_in, peers_out / n * v / bw_out
        sh_in = peers_in / n * v * (1 / capped - 1 / bw_in)
        msg_in = peers_in * (lat_in + params.small_message_half_bytes / bw_in)
        msg_out = peers_out * (lat_out + params.small_message_half_bytes / bw_out)
        if vol_out + msg_out > vol_in + msg_in + sh_in:
            volume, messages = volume + vol_out, messages + msg_out
        else:
            volume, messages, shared = volume + vol_in, messages + msg_in, shared + sh_in
    return volume, messages, shared


def _ring(p: int, steps: list[tuple[float, float]], overhead: float) -> float:
    """Time of one ring pass: ``p-1`` steps of ``max(compute + overhead, transfer)`` then the
    last step's compute (``steps``: (compute per step, transfer per step) per pass)."""
    return sum((p - 1) * max(c + overhead, t) + c for c, t in steps)


def _attention(model, cluster, cand, mbs, dtype, params, forward_only=False) -> _Attention:
    a, p, tp, cp, seq = cand.layout.a2a, cand.layout.p2p, cand.tp, cand.cp, cand.seq
    b = DTYPE_BYTES[dtype]
    groups = _groups(cand, cluster)
    fwd, bwd = causal_attention_flops(seq, model.heads, model.head_dim, mbs)
    if forward_only:
        bwd = 0.0
    block_tokens = seq / p
    heads_per_rank = model.heads / (tp * a)
    peak = peak_flops(cluster, params, dtype, _ranks_on_node(cand, cluster))
    f_block = block_tokens / (block_tokens + params.half_efficiency_tokens)
    if params.large_block_tokens:
        f_block /= 1 + block_tokens / params.large_block_tokens
    f_heads = heads_per_rank / (heads_per_rank + params.half_efficiency_heads)
    rate = peak * params.compute_efficiency * f_block * f_heads
    comp_f, comp_b = fwd / (tp * cp) / rate, bwd / (tp * cp) / rate
    ideal = (fwd + bwd) / (tp * cp) / (peak * params.compute_efficiency)
    no_heads = ideal / f_block
    terms = {"compute_ideal_s": ideal, "compute_short_block_s": no_heads - ideal,
             "compute_few_heads_s": comp_f + comp_b - no_heads}

    local_tokens = mbs * seq / cp
    q_bytes = local_tokens * model.heads / tp * model.head_dim * b
    kv_bytes = local_tokens * model.kv_heads / tp * model.head_dim * b  # K or V
    a2a_s = 0.0
    if a > 1:
        link_bw, lat = _link(cluster, params, False)
        capped = link_bw
        if cluster.node_aggregate_bw_gbs is not None:
            # every rank of the node is in an a2a group and they all send at once
            agg = cluster.node_aggregate_bw_gbs * 1e9 * params.intra_bw_efficiency
            capped = min(link_bw, agg / _ranks_on_node(cand, cluster))
        volumes = [q_bytes, kv_bytes, kv_bytes, q_bytes]  # forward Q, K, V in, O back
        if not forward_only:
            volumes += [q_bytes, q_bytes, kv_bytes, kv_bytes]  # backward dO in, dQ, dK, dV back
        vol, msgs, shared = _a2a(volumes, a, groups.a2a_members_per_node, (link_bw, capped, lat),
                                 _link(cluster, params, True), params)
        a2a_s = vol + msgs + shared
        terms.update(a2a_volume_s=vol, a2a_messages_s=msgs, a2a_shared_link_s=shared)

    # after the all-to-all a rank holds seq/p tokens of heads/(tp*a): a K+V block is
    # 2 * mbs * seq/p * kv_heads/(tp*a) * head_dim * bytes (= K+V of the local chunk)
    kv_block = 2 * mbs * (seq / p) * model.kv_heads / (tp * a) * model.head_dim * b
    p2p_s = 0.0
    if p > 1:
        bw, lat = _link(cluster, params, groups.p2p_crosses_nodes)
        step_f, step_b = comp_f / p, comp_b / p
        send_kv, send_kv_dkv = lat + kv_block / bw, lat + 2 * kv_block / bw
        steps = [(step_f, send_kv)] + ([] if forward_only else [(step_b, send_kv_dkv)])
        # each step after the first folds its partial result into the running one (output
        # and LSE forward, dQ backward): an fp32 read-modify-write of the local output
        out_elems = mbs * block_tokens * heads_per_rank * model.head_dim
        merge = 0.0
        if cluster.hbm_bw_gbs is not None:
            merge = out_elems * params.ring_merge_bytes_per_element / (cluster.hbm_bw_gbs * 1e9)
        overhead = params.ring_step_overhead_us * 1e-6 + merge
        handback = 0.0 if forward_only else send_kv  # the last dK/dV block goes home
        plain = _ring(p, steps, 0.0) + handback
        full = _ring(p, steps, overhead) + handback
        p2p_s = full - comp_f - comp_b
        terms.update(ring_transfer_s=plain - comp_f - comp_b, ring_step_overhead_s=full - plain)
    return _Attention(comp_f + comp_b, a2a_s, p2p_s, q_bytes + 2 * kv_bytes, kv_block,
                      Terms(**terms))


def _buffers_gib(cand: Candidate, att: _Attention) -> tuple[float, float]:
    a2a = 2 * att.qkvo_bytes if cand.layout.a2a > 1 else 0.0  # send + receive, one layer
    p2p = 4 * att.kv_block_bytes if cand.layout.p2p > 1 else 0.0  # K/V and dK/dV, 2 buffers
    return a2a / GIB, p2p / GIB


def predict_attention_layer(
    model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, *, mbs: int = 1,
    dtype: str = "bf16", params: CostParams = CostParams(), forward_only: bool = False,
) -> Prediction:
    """One attention layer's core, forward and backward (what ``runner=attention`` measures).

    ``other_s`` is the fixed per-layer overhead; memory is the layer's Q/K/V/O and buffers.
    ``forward_only``: the forward pass alone (FLOPs, the four forward all-to-alls, the
    forward ring), as inference benchmarks such as the yunchang tables measure it.
    """
    _check(model, cluster, candidate, mbs, dtype)
    att = _attention(model, cluster, candidate, mbs, dtype, params, forward_only)
    other = params.layer_overhead_us * 1e-6
    a2a_gib, p2p_gib = _buffers_gib(candidate, att)
    acts = (att.qkvo_bytes + att.qkvo_bytes * model.heads / (model.heads + 2 * model.kv_heads))
    mem = MemoryBreakdown(weights_gib=0.0, grads_gib=0.0, optimizer_gib=0.0,
                          activations_gib=acts / GIB, a2a_buffers_gib=a2a_gib,
                          p2p_buffers_gib=p2p_gib)
    return Prediction(
        step_time_s=att.compute_s + att.a2a_s + att.p2p_s + other, compute_s=att.compute_s,
        exposed_a2a_s=att.a2a_s, exposed_p2p_s=att.p2p_s, other_s=other,
        memory_gib=mem.total_gib, memory=mem, terms=att.terms, label=label_for(cluster, params),
    )


def predict(
    model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, *, mbs: int = 1,
    dtype: str = "bf16", params: CostParams = CostParams(), micro_batches: int = 1,
    recompute: Recompute = Recompute(),
) -> Prediction:
    """One full training step of ``candidate`` on ``cluster``: ``micro_batches`` micro-batches
    of ``mbs`` sequences through ``candidate.pp`` pipeline stages (1F1B), forward and
    backward, with ``recompute`` as Bridge configures it (pipeline.py). Times and memory
    are those of the busiest stage; with pp=1, one micro-batch and no recompute this is
    one micro-batch through every layer."""
    _check(model, cluster, candidate, mbs, dtype)
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, but got {micro_batches=}.")
    att = _attention(model, cluster, candidate, mbs, dtype, params)
    pp, tp, cp, b = candidate.pp, candidate.tp, candidate.cp, DTYPE_BYTES[dtype]
    L, m = stage_layers(model.layers, pp), micro_batches
    tokens = mbs * candidate.seq / cp
    ranks_on_node = _ranks_on_node(candidate, cluster)

    gemm_fwd = L * layer_gemm_flops(tokens, model.hidden, model.ffn_hidden, model.heads,
                                    model.kv_heads, model.head_dim)
    gemm_fwd += lm_head_flops(tokens, model.hidden, model.vocab)  # the last stage's
    gemm_s = 3 * gemm_fwd / tp / (peak_flops(cluster, params, dtype, ranks_on_node)
                                  * params.other_efficiency)
    tp_s = 0.0
    if tp > 1:  # sequence parallel: 2 all-gathers + 2 reduce-scatters forward, same backward
        bw, lat = _link(cluster, params, tp > cluster.gpus_per_node)
        tp_s = L * 8 * ((tp - 1) / tp * tokens * model.hidden * b / bw + lat)
    other = gemm_s + tp_s + L * params.layer_overhead_us * 1e-6
    att_layer = att.compute_s + att.a2a_s + att.p2p_s
    # recompute: the attention core's forward again (selective), or whole layers' forward
    redo = recomputed_layers(L, recompute) * FORWARD_SHARE * (att_layer + (other / L))
    if recompute.granularity == "selective":
        redo = L * FORWARD_SHARE * att.compute_s
    slot = L * att_layer + other + redo  # one micro-batch through this stage
    send_s = 0.0
    if pp > 1:  # forward activations out, backward gradients back, per micro-batch
        stage_ranks = tp * cp * candidate.dp
        bw, lat = _link(cluster, params, stage_ranks >= cluster.gpus_per_node)
        send_s = m * 2 * (lat + tokens * model.hidden / tp * b / bw)

    stage_params = model.params
    if pp > 1:  # this stage's layers and one of the two embedding-sized matrices
        embed = model.vocab * model.hidden
        stage_params = (model.params - 2 * embed) / pp + embed
    n = stage_params / tp
    per_token = 4 * model.hidden + (2 * model.heads + 2 * model.kv_heads) * model.head_dim \
        + 3 * model.ffn_hidden  # saved elements per token per layer (LN/GEMM inputs, QKV, O, MLP)
    layer_bytes = tokens * per_token / tp * b
    saved = saved_activations(layer_bytes, tokens * model.hidden / tp * b,
                              tokens * model.heads * model.head_dim / tp * b, L, recompute)
    logits = tokens * model.vocab / tp * 4  # fp32, on the last stage
    acts = saved + logits if pp == 1 else max(saved * in_flight(pp, m), saved + logits)
    a2a_gib, p2p_gib = _buffers_gib(candidate, att)
    mem = MemoryBreakdown(
        weights_gib=n * b / GIB, grads_gib=n * 4 / GIB,
        optimizer_gib=n * 12 / (candidate.dp * cp) / GIB, activations_gib=acts / GIB,
        a2a_buffers_gib=a2a_gib, p2p_buffers_gib=p2p_gib,
    )
    compute, a2a, p2p = m * L * att.compute_s, m * L * att.a2a_s, m * L * att.p2p_s
    return Prediction(
        step_time_s=compute + a2a + p2p + m * other + m * redo + (pp - 1) * slot + send_s,
        compute_s=compute, exposed_a2a_s=a2a, exposed_p2p_s=p2p, other_s=m * other,
        recompute_s=m * redo, bubble_s=(pp - 1) * slot, pp_send_s=send_s,
        memory_gib=mem.total_gib, memory=mem, terms=att.terms.scaled(m * L),
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
