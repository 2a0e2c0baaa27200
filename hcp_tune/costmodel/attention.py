"""The attention core of one layer on one layout: its compute, all-to-all and ring times
(``attention_core``), the links and rank placement they run on, and the buffers they hold.
``formulas`` builds a layer's and a training step's prediction from it. Standard library
only; all times are per rank, in seconds.

The attention core of one layer, forward and backward (``formulas.predict_attention_layer``;
the attention runner measures exactly this):

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
- packed sequences (``packed``, a ``packed.PackedWork``): the compute is the documents'
  ``sum(d^2)`` work, each document's kernel at its own short-block efficiency, times the
  slowest a2a group's share (``compute_imbalance_s``); every transfer is unchanged (the
  tensors still hold ``seq`` tokens), so the ring hides less.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.costmodel.params import DTYPE_BYTES, GIB, CostParams, Terms
from hcp_tune.flops import causal_attention_flops, packed_attention_flops
from hcp_tune.space.layout import Candidate, rank_groups


def node_ranks(cand: Candidate, cluster: ClusterProfile) -> int:
    world = cand.tp * cand.cp * cand.dp * cand.pp
    return max(1, min(world, cluster.gpus_per_node))


def peak_flops(cluster: ClusterProfile, params: CostParams, dtype: str,
               ranks_on_node: int) -> float:
    """Peak FLOP/s one rank can use: the profile's dense bf16 peak (half of it for fp32, i.e.
    TF32), or on CPU the nominal per-core rate times the cores each rank gets."""
    if cluster.peak_bf16_tflops is not None:
        return cluster.peak_bf16_tflops * 1e12 * (0.5 if dtype == "fp32" else 1.0)
    cores = params.cpu_cores or os.cpu_count() or 1
    share = min(1.0, cores / ranks_on_node) ** params.cpu_share_exponent
    return params.cpu_core_gflops * 1e9 * share


def link(cluster: ClusterProfile, params: CostParams, crosses: bool) -> tuple[float, float]:
    """(bytes/s, latency s) of one link kind."""
    if crosses:
        return (cluster.inter_node_bw_gbs * 1e9 * params.inter_bw_efficiency,
                cluster.inter_node_latency_us * 1e-6 * params.latency_multiplier)
    return (cluster.intra_node_bw_gbs * 1e9 * params.intra_bw_efficiency,
            cluster.intra_node_latency_us * 1e-6 * params.latency_multiplier)


def layout_groups(cand: Candidate, cluster: ClusterProfile):
    if cand.groups is not None:
        return cand.groups
    return rank_groups(cand.layout, tp=cand.tp, dp=cand.dp, pp=cand.pp,
                       gpus_per_node=cluster.gpus_per_node)


@dataclass(frozen=True)
class AttentionCore:
    compute_s: float
    a2a_s: float
    p2p_s: float
    qkvo_bytes: float  # Q + K + V of the local chunk (a2a send buffer of one direction)
    kv_block_bytes: float  # one ring K/V block
    terms: Terms


def a2a_parts(volumes: list[float], n: int, local: int, intra: tuple[float, float, float],
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


def ring_pass(p: int, steps: list[tuple[float, float]], overhead: float) -> float:
    """Time of one ring pass: ``p-1`` steps of ``max(compute + overhead, transfer)`` then the
    last step's compute (``steps``: (compute per step, transfer per step) per pass)."""
    return sum((p - 1) * max(c + overhead, t) + c for c, t in steps)


def block_efficiency(tokens: float, params: CostParams) -> float:
    """How much of its long-block efficiency a kernel over ``tokens`` queries/keys reaches."""
    f = tokens / (tokens + params.half_efficiency_tokens)
    if params.large_block_tokens:
        f /= 1 + tokens / params.large_block_tokens
    return f


def attention_core(model, cluster, cand, mbs, dtype, params, forward_only=False,
                   packed=None) -> AttentionCore:
    a, p, tp, cp, seq = cand.layout.a2a, cand.layout.p2p, cand.tp, cand.cp, cand.seq
    b = DTYPE_BYTES[dtype]
    groups = layout_groups(cand, cluster)
    fwd, bwd = causal_attention_flops(seq, model.heads, model.head_dim, mbs)
    if packed is not None:  # the documents' sum(d^2) instead of seq^2, per mbs sequences
        fwd, bwd = (x * mbs / packed.sequences for x in packed_attention_flops(
            [d for d, _ in packed.docs], model.heads, model.head_dim))
    if forward_only:
        bwd = 0.0
    block_tokens = seq / p
    heads_per_rank = model.heads / (tp * a)
    peak = peak_flops(cluster, params, dtype, node_ranks(cand, cluster))
    inv_block = (1 / block_efficiency(block_tokens, params) if packed is None else
                 packed.inverse_efficiency(lambda t: block_efficiency(t, params)))
    f_heads = heads_per_rank / (heads_per_rank + params.half_efficiency_heads)
    ideal = (fwd + bwd) / (tp * cp) / (peak * params.compute_efficiency)
    no_heads = ideal * inv_block
    balanced = no_heads / f_heads
    total = balanced * (packed.imbalance if packed is not None else 1.0)
    comp_f, comp_b = (total * fwd / (fwd + bwd), total * bwd / (fwd + bwd)) if fwd else (0, 0)
    terms = {"compute_ideal_s": ideal, "compute_short_block_s": no_heads - ideal,
             "compute_few_heads_s": balanced - no_heads, "compute_imbalance_s": total - balanced}

    local_tokens = mbs * seq / cp
    q_bytes = local_tokens * model.heads / tp * model.head_dim * b
    kv_bytes = local_tokens * model.kv_heads / tp * model.head_dim * b  # K or V
    a2a_s = 0.0
    if a > 1:
        link_bw, lat = link(cluster, params, False)
        capped = link_bw
        if cluster.node_aggregate_bw_gbs is not None:
            # every rank of the node is in an a2a group and they all send at once
            agg = cluster.node_aggregate_bw_gbs * 1e9 * params.intra_bw_efficiency
            capped = min(link_bw, agg / node_ranks(cand, cluster))
        volumes = [q_bytes, kv_bytes, kv_bytes, q_bytes]  # forward Q, K, V in, O back
        if not forward_only:
            volumes += [q_bytes, q_bytes, kv_bytes, kv_bytes]  # backward dO in, dQ, dK, dV back
        vol, msgs, shared = a2a_parts(volumes, a, groups.a2a_members_per_node,
                                      (link_bw, capped, lat), link(cluster, params, True), params)
        a2a_s = vol + msgs + shared
        terms.update(a2a_volume_s=vol, a2a_messages_s=msgs, a2a_shared_link_s=shared)

    # after the all-to-all a rank holds seq/p tokens of heads/(tp*a): a K+V block is
    # 2 * mbs * seq/p * kv_heads/(tp*a) * head_dim * bytes (= K+V of the local chunk)
    kv_block = 2 * mbs * (seq / p) * model.kv_heads / (tp * a) * model.head_dim * b
    p2p_s = 0.0
    if p > 1:
        bw, lat = link(cluster, params, groups.p2p_crosses_nodes)
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
        plain = ring_pass(p, steps, 0.0) + handback
        full = ring_pass(p, steps, overhead) + handback
        p2p_s = full - comp_f - comp_b
        terms.update(ring_transfer_s=plain - comp_f - comp_b, ring_step_overhead_s=full - plain)
    return AttentionCore(comp_f + comp_b, a2a_s, p2p_s, q_bytes + 2 * kv_bytes, kv_block,
                      Terms(**terms))


def buffers_gib(cand: Candidate, att: AttentionCore) -> tuple[float, float]:
    a2a = 2 * att.qkvo_bytes if cand.layout.a2a > 1 else 0.0  # send + receive, one layer
    p2p = 4 * att.kv_block_bytes if cand.layout.p2p > 1 else 0.0  # K/V and dK/dV, 2 buffers
    return a2a / GIB, p2p / GIB
