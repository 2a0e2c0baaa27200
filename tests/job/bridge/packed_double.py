"""The packed (THD) side of the Bridge test double (pretrain_double.py): a stage that hands
``packed_seq_params`` to its attention modules by keyword, as Megatron-Core's attention
calls TE's; the ``PackedSeqParams`` Bridge's forward step builds from a packed batch
(Megatron-Core's real class); and the CP split of a packed batch. Not Bridge: a stand-in.
"""
from __future__ import annotations

import torch


class ModelDouble(torch.nn.Module):
    """A stage: the blocks, called with the forward step's ``packed_seq_params`` by keyword
    as Megatron-Core's attention calls TE's; an embedding for token batches (packed data).
    ``packed``: what the forward step hands on, "thd" as Bridge's ``gpt_step`` does, "drop"
    (a stack that lost the batch's cu_seqlens), "cp_off" (``local_cp_size=1``, no group)."""

    def __init__(self, blocks: list, hidden: int, vocab: int, packed: str = "thd") -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.packed = packed

    def forward(self, x, packed_seq_params=None):
        if x.dtype == torch.long:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x, packed_seq_params=packed_seq_params)
        return x


def packed_params_double(batch: dict, mode: str):
    """Megatron-Core's ``PackedSeqParams`` from a packed batch, as Bridge's
    ``get_packed_seq_params`` builds it (the current keys, squeezed; qkv_format thd)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if mode == "drop":
        return None
    if mode == "cp_off":
        return PackedSeqParams(qkv_format="thd", local_cp_size=1,
                               cu_seqlens_q=batch["cu_seqlens_q"].squeeze(0))
    return PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=batch["cu_seqlens_q"].squeeze(0),
        cu_seqlens_kv=batch["cu_seqlens_kv"].squeeze(0),
        cu_seqlens_q_padded=batch["cu_seqlens_q_padded"].squeeze(0),
        cu_seqlens_kv_padded=batch["cu_seqlens_kv_padded"].squeeze(0),
        max_seqlen_q=int(batch["max_seqlen_q"].max()),
        max_seqlen_kv=int(batch["max_seqlen_kv"].max()))


def partition_double(batch: dict) -> dict:
    """This CP rank's tokens of a packed batch (Bridge: ``_partition_packed_batch_for_cp``
    through Megatron-Core's THD partition): chunks r and 2*cp-1-r of every padded entry."""
    from megatron.core import parallel_state as ps

    cp, r = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
    bounds = batch["cu_seqlens_q_padded"].squeeze(0).tolist()
    index = []
    for a, b in zip(bounds, bounds[1:]):
        c = (b - a) // (2 * cp)
        for k in (r, 2 * cp - 1 - r):
            index += range(a + k * c, a + (k + 1) * c)
    index = torch.tensor(index, dtype=torch.long)
    return {k: (v.index_select(1, index) if not k.startswith(("cu_seqlens", "max_seqlen"))
                else v) for k, v in batch.items()}
