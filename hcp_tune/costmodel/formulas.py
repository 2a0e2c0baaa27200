"""Analytical cost model: predicted step time and memory of one HCP layout on a cluster.

What belongs here: the step's and the layer's formulas over the attention core
(``attention``); the free parameters and result records are in ``params`` and are
importable from here too. Standard library only; no torch, no files (``calibrate`` fits and
stores the parameters, ``predict`` makes tables). All times are per rank, in seconds.

One training step (``predict``) = ``layers`` x the attention core of a layer (``attention``:
compute, all-to-all and ring, forward and backward; ``predict_attention_layer`` is one
layer of it, what the attention runner measures) + the rest (``other_s``: GEMMs, TP
collectives, per-layer overhead), which does not depend on ``[a2a, p2p]``.

Pipeline and recompute (pipeline.py): a stage holds ``layers/pp`` layers; a step runs
``m = gbs/(mbs*dp)`` micro-batches through the 1F1B schedule, ``m`` slots of work plus
``pp-1`` idle slots (the bubble) of the busiest stage (its layers plus the output layer),
plus two sends of ``seq/cp x hidden/tp`` activations per micro-batch between stages.

Memory per rank (GiB), of the stage that needs most: bf16 weights and fp32 gradients of
the stage's parameters over TP, fp32 master weights and Adam moments (12 B/param) sharded
over dp*cp (Megatron's distributed optimizer shards over the data-parallel-with-CP group),
activations of the local ``seq/cp`` tokens for the stage's layers (sequence parallel over
TP, flash attention: no seq^2 term; less with recompute) times the micro-batches the first
stage keeps in flight (``min(pp, m)``), fp32 logits on the last stage, one layer's a2a
send/receive buffers and the ring's double-buffered K/V and dK/dV blocks. Gradient
reduce-scatter / parameter all-gather of the distributed optimizer are assumed overlapped
with backward/forward and are not counted.
"""
from __future__ import annotations

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.costmodel.attention import (
    attention_core,
    buffers_gib,
    link,
    node_ranks,
    peak_flops,
)
from hcp_tune.costmodel.params import (  # noqa: F401  (importable from here: their users')
    A2A_CALLS_PER_LAYER,
    DTYPE_BYTES,
    FIT_FIELDS,
    FIT_MAX,
    FIT_MAX_GPU,
    FIT_START,
    GIB,
    CostParams,
    MemoryBreakdown,
    Prediction,
    Terms,
    label_for,
)
from hcp_tune.costmodel.packed import PackedWork
from hcp_tune.flops import layer_gemm_flops, lm_head_flops
from hcp_tune.space.layout import Candidate, layout_facts
from hcp_tune.upstream.pipeline import (
    FORWARD_SHARE,
    Recompute,
    in_flight,
    recomputed_layers,
    saved_activations,
    stage_layers,
)
from hcp_tune.upstream.rules import LAYOUT_RULES, evaluate


def predict_attention_layer(
    model: ModelSpec, cluster: ClusterProfile, candidate: Candidate, *, mbs: int = 1,
    dtype: str = "bf16", params: CostParams = CostParams(), forward_only: bool = False,
    packed: PackedWork | None = None,
) -> Prediction:
    """One attention layer's core, forward and backward (what ``runner=attention`` measures).

    ``other_s`` is the fixed per-layer overhead; memory is the layer's Q/K/V/O and buffers.
    ``forward_only``: the forward pass alone (FLOPs, the four forward all-to-alls, the
    forward ring), as inference benchmarks such as the yunchang tables measure it.
    ``packed``: the layout's packed documents (``packed.packed_work``), None: fixed length.
    """
    _check(model, cluster, candidate, mbs, dtype)
    att = attention_core(model, cluster, candidate, mbs, dtype, params, forward_only, packed)
    other = params.layer_overhead_us * 1e-6
    a2a_gib, p2p_gib = buffers_gib(candidate, att)
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
    recompute: Recompute = Recompute(), packed: PackedWork | None = None,
) -> Prediction:
    """One full training step of ``candidate`` on ``cluster``: ``micro_batches`` micro-batches
    of ``mbs`` sequences through ``candidate.pp`` pipeline stages (1F1B), forward and
    backward, with ``recompute`` as Bridge configures it (pipeline.py). Times and memory
    are those of the busiest stage; with pp=1, one micro-batch and no recompute this is
    one micro-batch through every layer. ``packed``: packed documents (``attention``); the
    GEMMs still run every one of the ``seq`` tokens (padding and unfilled tail too)."""
    _check(model, cluster, candidate, mbs, dtype)
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, but got {micro_batches=}.")
    att = attention_core(model, cluster, candidate, mbs, dtype, params, packed=packed)
    pp, tp, cp, b = candidate.pp, candidate.tp, candidate.cp, DTYPE_BYTES[dtype]
    L, m = stage_layers(model.layers, pp), micro_batches
    tokens = mbs * candidate.seq / cp
    ranks_on_node = node_ranks(candidate, cluster)

    gemm_fwd = L * layer_gemm_flops(tokens, model.hidden, model.ffn_hidden, model.heads,
                                    model.kv_heads, model.head_dim)
    gemm_fwd += lm_head_flops(tokens, model.hidden, model.vocab)  # the last stage's
    gemm_s = 3 * gemm_fwd / tp / (peak_flops(cluster, params, dtype, ranks_on_node)
                                  * params.other_efficiency)
    tp_s = 0.0
    if tp > 1:  # sequence parallel: 2 all-gathers + 2 reduce-scatters forward, same backward
        bw, lat = link(cluster, params, tp > cluster.gpus_per_node)
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
        bw, lat = link(cluster, params, stage_ranks >= cluster.gpus_per_node)
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
    a2a_gib, p2p_gib = buffers_gib(candidate, att)
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
