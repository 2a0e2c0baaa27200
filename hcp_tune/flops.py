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
    fwd = 4.0 * seq * seq * heads * head_dim * mbs / 2.0
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
