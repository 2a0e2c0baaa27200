"""FLOP counts shared by the cost model (orchestrator) and the measured runners (job side).

Standard library only, so the job side may import it inside the training container. Every
formula counts a multiply-add as 2 FLOPs and names its source.
"""
from __future__ import annotations

BACKWARD_OVER_FORWARD_ATTENTION = 2.5  # FlashAttention convention: bwd = 2.5 x fwd (recompute)
BACKWARD_OVER_FORWARD_GEMM = 2.0  # a GEMM's backward is two GEMMs of the same size


def causal_attention_flops(seq: int, heads: int, head_dim: int, mbs: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal attention over one full sequence, one layer.

    Forward: ``QK^T`` and ``PV`` are each ``2*seq^2*heads*head_dim`` per sample, halved by
    the causal mask: ``4*seq^2*heads*head_dim*mbs/2``. Backward is 2.5x the forward
    (the FlashAttention benchmarks' convention, flash_attn/utils/benchmark.py). GQA does not
    change the count: it is set by the query heads.
    """
    return packed_attention_flops([seq] * mbs, heads, head_dim)


def packed_attention_flops(docs: list[int], heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal attention over packed documents (THD), one layer.

    Attention runs within each document only, so the work is ``sum(d^2)`` over the
    documents' real (unpadded) lengths, not ``S^2`` of the packed sequence: forward
    ``4*sum(d^2)*heads*head_dim/2``, backward 2.5x, as ``causal_attention_flops`` (which is
    this with one document a sequence). Padding tokens do no model work and are not counted.
    """
    fwd = 4.0 * sum(d * d for d in docs) * heads * head_dim / 2.0
    return fwd, BACKWARD_OVER_FORWARD_ATTENTION * fwd


def layer_gemm_flops(
    tokens: int, hidden: int, ffn_hidden: int, heads: int, kv_heads: int, head_dim: int
) -> float:
    """Forward FLOPs of one transformer layer's GEMMs for ``tokens`` tokens (no attention core).

    QKV projection ``hidden x (heads + 2*kv_heads)*head_dim``, output projection
    ``heads*head_dim x hidden``, SwiGLU MLP (three ``hidden x ffn_hidden`` matrices); 2 FLOPs
    per multiply-add (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
    on GPU Clusters", eq. 3, with GQA and SwiGLU shapes). Backward is 2x.
    """
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * ffn_hidden
    return 2.0 * tokens * (attn + mlp)


def lm_head_flops(tokens: int, hidden: int, vocab: int) -> float:
    """Forward FLOPs of the output (logits) layer. Backward is 2x."""
    return 2.0 * tokens * hidden * vocab


# Megatron-Bridge's count, so a Bridge trial's TFLOP/s agree with Bridge's own log line.
# Ported (restated, not copied) from Megatron-Bridge v0.6.0 (commit 51885cf132b2), file
# src/megatron/bridge/training/utils/flop_utils.py, ``num_floating_point_operations`` ->
# ``transformer_flops``, for the dense GPT case only: no MoE, no MLA, no sliding window, no
# multi-token prediction, no attention output gate, no LoRA. The padded vocabulary is
# Megatron-LM's ``calculate_padded_vocab_size`` (megatron/training/vocab_utils.py at the
# Megatron-LM commit Bridge v0.6.0 pins, cd4afffa648426a9): round up to a multiple of
# ``make_vocab_size_divisible_by * tp``.
BRIDGE_FLOPS_SOURCE = ("Megatron-Bridge v0.6.0 (51885cf132b2) training/utils/flop_utils.py "
                       "num_floating_point_operations, dense GPT")


def padded_vocab_size(vocab: int, divisible_by: int = 128, tp: int = 1) -> int:
    """The vocabulary Megatron pads to: the next multiple of ``divisible_by * tp``."""
    if vocab <= 0 or divisible_by <= 0 or tp <= 0:
        raise ValueError(f"padded_vocab_size: expected positive values, got {vocab=}, "
                         f"{divisible_by=}, {tp=}")
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def bridge_gpt_flops(*, batch: int, seq: int, layers: int, hidden: int, ffn_hidden: int,
                     heads: int, kv_heads: int, head_dim: int, vocab: int, tp: int = 1,
                     gated_linear_unit: bool = True, vocab_divisible_by: int = 128) -> float:
    """Training FLOPs (forward + backward) of one step over ``batch`` sequences of ``seq``
    tokens, counted as Bridge counts them for a dense GPT.

    Every term is per token and multiplied by ``batch*seq``; each carries ``3*2``: forward
    plus a backward of twice the forward, 2 FLOPs per multiply-add.

    - MLP: ``6*hidden*ffn_hidden*E*layers``, ``E = 3`` projections with a gated linear unit
      (SwiGLU), 2 without;
    - attention projections: ``6*layers*(hidden*(q + 2*kv) + q*hidden)`` with
      ``q = head_dim*heads`` and ``kv = head_dim*kv_heads`` (GQA shrinks K and V only);
    - core attention: ``6*layers*q*seq`` (QK^T and PV, ``2*seq*q`` each, halved by the
      causal mask);
    - logits: ``6*hidden*padded_vocab``.
    """
    q = head_dim * heads
    kv = head_dim * kv_heads
    expansion = 3 if gated_linear_unit else 2
    mlp = 6 * hidden * ffn_hidden * expansion * layers
    attn = 6 * layers * (hidden * (q + 2 * kv) + q * hidden + q * seq)
    logits = 6 * hidden * padded_vocab_size(vocab, vocab_divisible_by, tp)
    return float(batch * seq * (mlp + attn + logits))
