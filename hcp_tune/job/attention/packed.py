"""Packed sequences (THD) on the job side: the packed stream of a trial and the pure-torch
reference attention over it.

**The stream.** A trial's documents (``TrialSpec.packed_docs``, every micro-batch sequence
in order: attention never crosses a document, so sequences laid end to end are the same
work; THD has no batch dimension) are laid out one after another, each padded to a
multiple of ``2*cp`` (``hcp_tune.packing``). CP rank ``r`` holds chunks ``r`` and
``2*cp-1-r`` of every padded document (``packing.rank_ranges``), as Megatron-Core and TE
split packed documents. Tensors are bshd with b = 1 here; TE's path runs the same tokens
as thd ([t, h, d]).

**The attention** (``PackedRefAttention``): causal within each document only, padding
left out, with the two levels of ``reference``:

1. the all-to-all over the a2a group gathers the group's tokens and scatters the heads; an
   index order puts them, document by document, into the placement the ring expects: the
   a2a group k of the ring holds chunks k and 2p-1-k (of a tokens per rank-chunk each) of
   every document, again a per-document load-balanced placement, now over p ranks;
2. the ring passes K/V blocks as in the fixed-length mode, and each step computes only the
   blocks the causal mask and the document boundaries leave (``reference._blocks``): a
   query chunk against an earlier key chunk of its own document, its own chunk's triangle,
   each trimmed to the document's real tokens. The work done is the packed work,
   ``sum(d^2)`` at chunk granularity, not ``S^2`` with a mask.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

import hcp_tune.packing as packing
from hcp_tune.job.attention.reference import RefHCPAttention, Ring, build_ref_attention


@dataclass(frozen=True)
class PackedStream:
    """Documents (real lengths, stream order) packed for ``cp`` CP ranks."""

    docs: tuple[int, ...]
    cp: int

    def __post_init__(self) -> None:
        if not self.docs or min(self.docs) < 1:
            raise ValueError(f"packed stream: documents {list(self.docs)[:8]}: expected at "
                             "least one, each of at least 1 token")
        if self.cp < 1:
            raise ValueError(f"packed stream: cp={self.cp}: expected an integer >= 1")

    @staticmethod
    def of(packed_docs: list[list[int]], cp: int) -> "PackedStream":
        """A trial's sequences (``TrialSpec.packed_docs``) as one stream."""
        return PackedStream(tuple(int(d) for sequence in packed_docs for d in sequence), cp)

    @functools.cached_property
    def padded(self) -> tuple[int, ...]:
        return tuple(packing.padded(d, self.cp) for d in self.docs)

    @property
    def tokens(self) -> int:
        """Length of the padded stream (every rank holds ``tokens // cp``)."""
        return sum(self.padded)

    @property
    def real_tokens(self) -> int:
        return sum(self.docs)

    @property
    def pad_between_seqs(self) -> bool:
        """Some document is padded: the real tokens are not contiguous (TE's flag)."""
        return self.padded != self.docs

    def cu_seqlens(self, *, padded: bool) -> list[int]:
        """Document offsets: of the real tokens (``cu_seqlens``) or of the padded stream."""
        return packing.cu_seqlens(list(self.docs), self.cp if padded else 0)

    def chunk_sizes(self, parts: int) -> tuple[int, ...]:
        """Tokens per chunk of each document when the stream is split over ``parts`` ranks
        (2 chunks each): ``parts`` must divide the padding unit's ``cp``."""
        if self.cp % parts:
            raise ValueError(f"packed stream padded for cp={self.cp} cannot be split over "
                             f"{parts} ranks")
        return tuple(p // (2 * parts) for p in self.padded)

    def ranges(self, pos: int) -> list[tuple[int, int]]:
        """The padded stream's token ranges CP position ``pos`` holds, in its local order."""
        return packing.rank_ranges(list(self.docs), self.cp, pos)

    def index(self, pos: int) -> torch.Tensor:
        return torch.cat([torch.arange(s, e) for s, e in self.ranges(pos)])

    @functools.cached_property
    def valid(self) -> torch.Tensor:
        """Positions of the real tokens in the padded stream (padding left out)."""
        starts = self.cu_seqlens(padded=True)
        return torch.cat([torch.arange(s, s + d) for s, d in zip(starts, self.docs)])


def packed_share(x: torch.Tensor, stream: PackedStream, pos: int) -> torch.Tensor:
    """CP position ``pos``'s tokens of the padded stream ``x`` (dim 1), in its local order."""
    return x.index_select(1, stream.index(pos).to(x.device))


def packed_unshare(pieces: list[torch.Tensor], stream: PackedStream) -> torch.Tensor:
    """The inverse of ``packed_share``: ``pieces[pos]`` back into one stream in order."""
    order = torch.cat([stream.index(pos) for pos in range(len(pieces))])
    full = torch.cat(pieces, dim=1)
    out = torch.empty_like(full)
    out[:, order.to(full.device)] = full
    return out


def a2a_order(sizes: tuple[int, ...], a: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(gather, inverse) indices of the packed all-to-all: the a2a group's tokens, read
    member after member (member m at ``m*L``, ``L`` tokens each, per document two chunks of
    ``sizes[i]``), into per-document order: the members' first chunks ascending, then their
    second chunks in reverse member order (these are the document's mirrored chunks)."""
    local = 2 * sum(sizes)
    parts = []
    offset = 0
    for c in sizes:
        parts += [m * local + offset + torch.arange(c) for m in range(a)]
        parts += [m * local + offset + c + torch.arange(c) for m in reversed(range(a))]
        offset += 2 * c
    gather = torch.cat(parts)
    return gather.to(device), torch.argsort(gather).to(device)


class PackedRefAttention(RefHCPAttention):
    """Per-document causal attention over a CP layout, packed stream in, same out.

    ``parts``: how many CP positions the input was split over (the trial's cp; 1 for the
    whole stream on one rank). With trivial groups and ``parts`` = cp it attends within the
    rank's own chunks only: what CP silently switched off computes.
    """

    qkv_format = "bshd"

    def __init__(self, *, a2a_group=None, ring: Optional[Ring] = None, parts: int = 1):
        super().__init__(a2a_group=a2a_group, ring=ring)
        self.parts = parts
        self._orders: dict = {}

    def __call__(self, q, k, v, stream: PackedStream):
        sizes = stream.chunk_sizes(self.parts)
        if q.shape[0] != 1 or q.shape[1] != 2 * sum(sizes):
            raise ValueError(f"packed input {tuple(q.shape[:2])}: expected (1, "
                             f"{2 * sum(sizes)}) tokens, this rank's share of the stream")
        order = None
        if self.a2a > 1:
            key = (sizes, q.device)
            if key not in self._orders:
                self._orders = {key: a2a_order(sizes, self.a2a, q.device)}  # the latest only
            order = self._orders[key]
        # after the all-to-all each chunk holds a times the tokens
        return self._attend(q, k, v, (stream.docs, tuple(self.a2a * c for c in sizes)), order)


def build_packed_ref_attention(groups, comm_type: str, cp: int, *, cp_off: bool = False
                               ) -> PackedRefAttention:
    """The packed reference layer for one layout of ``cp`` ranks (``cp_off``: the planted
    silent failure, each rank on its own share)."""
    return build_ref_attention(groups, comm_type, cp_off=cp_off,
                               layer=functools.partial(PackedRefAttention, parts=cp))


def stream_record(stream: PackedStream) -> dict:
    """What a result records of a trial's packed stream."""
    return {"documents": len(stream.docs), "tokens": stream.tokens,
            "real_tokens": stream.real_tokens, "longest": max(stream.docs),
            "shortest": min(stream.docs), "attention_work": sum(d * d for d in stream.docs),
            "pad_between_seqs": stream.pad_between_seqs}
