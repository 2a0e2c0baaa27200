"""Transformer Engine's DotProductAttention on the trial's CP groups (the CUDA path).

Signature used (TE >= 1.12, as Megatron-Core's TEDotProductAttention calls it):
``DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=, attention_dropout=,
qkv_format=, attn_mask_type="causal", cp_group=, cp_global_ranks=, cp_stream=, cp_comm_type=)``.
For ``a2a+p2p`` ``cp_group`` is the list ``[a2a_group, p2p_group]`` (level 0 first); for the
``p2p``/``a2a`` baselines it is the flat CP group. ``cp_global_ranks`` are always the flat
CP group's global ranks. TE is imported here only, and only when this path is chosen.
"""
from __future__ import annotations

from typing import Optional

from hcp_tune.spec import TE_MIN_HCP as MIN_TE


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def te_version() -> Optional[str]:
    try:
        import transformer_engine
    except Exception:  # ImportError, or a broken CUDA build raising at import
        return None
    return getattr(transformer_engine, "__version__", "0")


def te_unavailable_reason() -> Optional[str]:
    """Why the TE path cannot run here, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: the TE path needs a GPU (the torch reference runs instead)"
    ver = te_version()
    if ver is None:
        return "transformer_engine is not installed (or fails to import)"
    if _version_tuple(ver) < MIN_TE:
        return f"transformer_engine {ver} is older than 1.12, the first with a2a+p2p"
    return None


class TEAttention:
    """Callable on bshd tensors [b, s_local, h, d] -> [b, s_local, h, d]."""

    def __init__(self, *, heads: int, kv_heads: int, head_dim: int, groups, comm_type: str,
                 cp_off: bool = False):
        import torch
        import transformer_engine.pytorch as te

        kwargs = {}
        if not cp_off and comm_type != "none":
            if comm_type == "a2a+p2p":
                if not groups.hierarchical:
                    raise RuntimeError(
                        "a2a+p2p needs the HCP groups, but Megatron-Core has none "
                        "(hierarchical_context_parallel_sizes not given)"
                    )
                cp_group = [groups.a2a, groups.p2p]
            else:
                cp_group = groups.cp
            kwargs = dict(
                cp_group=cp_group,
                cp_global_ranks=list(groups.cp_ranks),
                cp_stream=torch.cuda.Stream(),
                cp_comm_type=comm_type,
            )
        self.heads, self.head_dim = heads, head_dim
        self.layer = te.DotProductAttention(
            num_attention_heads=heads,
            kv_channels=head_dim,
            num_gqa_groups=kv_heads,
            attention_dropout=0.0,
            qkv_format="bshd",
            attn_mask_type="causal",
            **kwargs,
        )

    def __call__(self, q, k, v):
        out = self.layer(q, k, v)  # bshd in, [b, s, h*d] out
        return out.view(q.shape[0], q.shape[1], self.heads, self.head_dim)
