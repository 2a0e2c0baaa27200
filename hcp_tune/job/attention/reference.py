"""Pure-torch hierarchical context-parallel causal attention (a2a+p2p), forward and backward.

The same scheme as Transformer Engine's ``cp_comm_type="a2a+p2p"``, written plainly so it
runs where TE cannot (CPU, gloo, fp32) and so its numbers can be checked:

1. all-to-all over the a2a group (level 0): gather the sequence, scatter the heads. Each
   CP rank at flat position j holds chunks j and 2cp-1-j (load-balanced causal placement);
   after the all-to-all an a2a group k holds "super-chunks" k and 2p-1-k of size a chunks,
   i.e. again a load-balanced placement, now over the p2p ring of size p = cp / a.
2. ring attention over the p2p group (level 1): K/V blocks travel to the next rank with
   isend/irecv while the current block is computed; partial results merge by
   log-sum-exp. Work is cut at chunk granularity: a query chunk sees an earlier key chunk
   fully, its own chunk through the causal triangle, a later one not at all.
3. the reverse all-to-all of the output.

The backward pass is our own autograd.Function: the ring runs again, dQ accumulates
locally and dK/dV travel the ring with their K/V block back to its owner; the all-to-alls
are permutations, so each one's backward is the other.

Tensors are bshd: [batch, seq, heads, head_dim]. GQA: KV heads are scattered over the a2a
group like query heads, so both counts must be divisible by the a2a size.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from hcp_tune.job.knobs import comm_delay


@dataclass(frozen=True)
class Ring:
    """A p2p ring: the process group, its members' global ranks in ring order, my index."""

    group: Any
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    @staticmethod
    def trivial() -> "Ring":
        return Ring(None, (0,), 0)

    @staticmethod
    def of(group) -> "Ring":
        ranks = tuple(dist.get_process_group_ranks(group))
        return Ring(group, ranks, ranks.index(dist.get_rank()))


# ---------------------------------------------------------------- local blocks


def _expand(x: torch.Tensor, rep: int) -> torch.Tensor:
    return x if rep == 1 else x.repeat_interleave(rep, dim=2)


def _reduce(dx: torch.Tensor, rep: int) -> torch.Tensor:
    if rep == 1:
        return dx
    b, s, h, d = dx.shape
    return dx.view(b, s, h // rep, rep, d).sum(3)


def _relation(qc: int, kc: int) -> Optional[str]:
    """How query chunk ``qc`` sees key chunk ``kc`` under a causal mask."""
    return "full" if qc > kc else "diag" if qc == kc else None


def _scores(q, k, scale, rel):
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if rel == "diag":
        n = q.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def _block_forward(q, k, v, scale, rel):
    s = _scores(q, k, scale, rel)
    lse = torch.logsumexp(s, dim=-1)  # [b, h, q]
    out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), v)
    return out, lse


def _merge(out, lse, bout, blse):
    """Combine two partial softmax results by their log-sum-exp (flash-attention style)."""
    new = torch.logaddexp(lse, blse)
    w_old = torch.exp(lse - new).transpose(1, 2)[..., None]  # [b, q, h, 1]
    w_new = torch.exp(blse - new).transpose(1, 2)[..., None]
    return out * w_old + bout * w_new, new


def _block_backward(q, k, v, dout, lse, delta, scale, rel):
    p = torch.exp(_scores(q, k, scale, rel) - lse[..., None])
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, v)
    ds = p * (dp - delta[..., None])
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    return dq, dk, dv


# ---------------------------------------------------------------- ring


def _exchange(send: torch.Tensor, ring: Ring):
    """Start passing ``send`` to the next ring member and receiving from the previous one."""
    comm_delay("p2p")  # HCP_TUNE_INJECT_DELAY=p2p:S (a testing aid, off by default)
    recv = torch.empty_like(send)
    nxt = ring.ranks[(ring.index + 1) % ring.size]
    prv = ring.ranks[(ring.index - 1) % ring.size]
    reqs = [dist.isend(send, nxt, group=ring.group), dist.irecv(recv, prv, group=ring.group)]
    return recv, reqs


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _valid(length: int, chunk: int, size: int) -> int:
    """Real tokens of chunk ``chunk`` (``size`` tokens) of a document of ``length`` real
    tokens: a prefix, as padding sits at the document's end."""
    return max(0, min(size, length - chunk * size))


@functools.lru_cache(maxsize=4096)
def _blocks(docs: tuple[int, ...], sizes: tuple[int, ...], me: int, owner: int, p: int
            ) -> tuple[tuple[int, int, int, int, str], ...]:
    """The attention blocks of one ring step: my query chunks against ``owner``'s K/V.

    Both hold chunks ``x`` and ``2p-1-x`` of every document (``docs``: real lengths,
    ``sizes``: chunk size per document), laid out document after document. A query chunk
    sees an earlier key chunk of its own document fully, its own through the causal
    triangle, a later one or another document's not at all; padding (each chunk's tail past
    the document's real tokens) is left out. Each block: (query start, query tokens, key
    start, key tokens, "full" | "diag"); a block with nothing to attend is not listed.
    """
    out = []
    offset = 0
    for length, size in zip(docs, sizes):
        for qi, qc in enumerate((me, 2 * p - 1 - me)):
            nq = _valid(length, qc, size)
            for ki, kc in enumerate((owner, 2 * p - 1 - owner)):
                rel = _relation(qc, kc)
                nk = _valid(length, kc, size)
                if rel is not None and nq and nk:
                    out.append((offset + qi * size, nq, offset + ki * size, nk, rel))
        offset += 2 * size
    return tuple(out)


def _ring_forward(q, k, v, ring: Ring, scale: float, geometry):
    p, me = ring.size, ring.index
    rep = q.shape[2] // k.shape[2]
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=q.dtype,
                     device=q.device)
    kv = torch.stack([k, v])
    for step in range(p):
        owner = (me - step) % p
        if step < p - 1:
            nxt, reqs = _exchange(kv, ring)
        kk, vv = _expand(kv[0], rep), _expand(kv[1], rep)
        for qs, nq, ks, nk, rel in _blocks(*geometry, me, owner, p):
            qsl, ksl = slice(qs, qs + nq), slice(ks, ks + nk)
            bout, blse = _block_forward(q[:, qsl], kk[:, ksl], vv[:, ksl], scale, rel)
            out[:, qsl], lse[:, :, qsl] = _merge(out[:, qsl], lse[:, :, qsl], bout, blse)
        if step < p - 1:
            _wait(reqs)
            kv = nxt
    return out, lse


def _ring_backward(q, k, v, out, lse, dout, ring: Ring, scale: float, geometry):
    p, me = ring.size, ring.index
    rep = q.shape[2] // k.shape[2]
    delta = (dout * out).sum(-1).transpose(1, 2)  # [b, h, q]
    dq = torch.zeros_like(q)
    kv = torch.stack([k, v])
    dkv = torch.zeros_like(kv)  # travels with its K/V block, back to the owner at the end
    for step in range(p):
        owner = (me - step) % p
        if step < p - 1:
            nxt, reqs = _exchange(kv, ring)
        kk, vv = _expand(kv[0], rep), _expand(kv[1], rep)
        dkk, dvv = torch.zeros_like(kk), torch.zeros_like(vv)
        for qs, nq, ks, nk, rel in _blocks(*geometry, me, owner, p):
            qsl, ksl = slice(qs, qs + nq), slice(ks, ks + nk)
            bdq, bdk, bdv = _block_backward(
                q[:, qsl], kk[:, ksl], vv[:, ksl], dout[:, qsl],
                lse[:, :, qsl], delta[:, :, qsl], scale, rel,
            )
            dq[:, qsl] += bdq
            dkk[:, ksl] += bdk
            dvv[:, ksl] += bdv
        dkv = dkv + torch.stack([_reduce(dkk, rep), _reduce(dvv, rep)])
        if step < p - 1:
            _wait(reqs)
            kv = nxt
        if p > 1:
            dkv, reqs2 = _exchange(dkv.contiguous(), ring)
            _wait(reqs2)
    return dq, dkv[0], dkv[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, scale: float, geometry):
        out, lse = _ring_forward(q, k, v, ring, scale, geometry)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.scale, ctx.geometry = ring, scale, geometry
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.ring, ctx.scale,
                                    ctx.geometry)
        return dq, dk, dv, None, None, None


# ---------------------------------------------------------------- all-to-all


def _seq_to_head(x: torch.Tensor, group, a: int, order=None) -> torch.Tensor:
    """[b, S, h, d] -> [b, a*S, h/a, d]: gather the a2a group's sequences, keep my heads.

    ``order`` (packed sequences): (gather, inverse) index tensors that put the members'
    tokens, read as member after member, into the ring's per-document placement; None: one
    document a sequence, placed by views."""
    b, s, h, d = x.shape
    send = x.reshape(b, s, a, h // a, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    comm_delay("a2a")  # HCP_TUNE_INJECT_DELAY=a2a:S (a testing aid, off by default)
    dist.all_to_all_single(recv, send, group=group)  # recv[m]: member m's tokens
    if order is not None:
        return recv.transpose(0, 1).reshape(b, a * s, h // a, d).index_select(1, order[0])
    half = s // 2
    first = [recv[m, :, :half] for m in range(a)]  # chunks ka .. ka+a-1
    second = [recv[m, :, half:] for m in reversed(range(a))]  # their mirrors, ascending
    return torch.cat(first + second, dim=1)


def _head_to_seq(y: torch.Tensor, group, a: int, order=None) -> torch.Tensor:
    """The inverse of ``_seq_to_head``: [b, a*S, h/a, d] -> [b, S, h, d]."""
    b, s2, hh, d = y.shape
    if order is not None:
        send = y.index_select(1, order[1]).reshape(b, a, s2 // a, hh, d).transpose(0, 1)
        send = send.contiguous()  # [a, b, S, hh, d]
    else:
        half = s2 // (2 * a)
        first = y[:, : s2 // 2].reshape(b, a, half, hh, d)
        second = y[:, s2 // 2 :].reshape(b, a, half, hh, d).flip(1)
        send = torch.cat([first, second], dim=2).transpose(0, 1).contiguous()  # [a, b, S, hh, d]
    recv = torch.empty_like(send)
    comm_delay("a2a")
    dist.all_to_all_single(recv, send, group=group)  # recv[m]: my tokens, member m's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s2 // a, a * hh, d)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, a, order=None):
        ctx.group, ctx.a, ctx.order = group, a, order
        return _seq_to_head(x, group, a, order)

    @staticmethod
    def backward(ctx, g):  # a permutation: its adjoint is its inverse
        return _head_to_seq(g.contiguous(), ctx.group, ctx.a, ctx.order), None, None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, a, order=None):
        ctx.group, ctx.a, ctx.order = group, a, order
        return _head_to_seq(y, group, a, order)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_head(g.contiguous(), ctx.group, ctx.a, ctx.order), None, None, None


# ---------------------------------------------------------------- the layer


class RefHCPAttention:
    """Causal attention over a CP layout: a2a group (level 0) then p2p ring (level 1).

    ``a2a_group=None`` (or size 1) is the plain ring (``p2p``); a trivial ring is plain
    all-to-all (``a2a``); both trivial is local attention over this rank's own tokens,
    which is exactly what CP silently switched off computes.
    """

    def __init__(self, *, a2a_group=None, ring: Optional[Ring] = None):
        self.a2a_group = a2a_group
        self.a2a = dist.get_world_size(a2a_group) if a2a_group is not None else 1
        self.ring = ring or Ring.trivial()

    def _check(self, q, k) -> float:
        """The scale 1/sqrt(head_dim), once the heads split over the a2a group."""
        if q.shape[2] % self.a2a or k.shape[2] % self.a2a:
            raise ValueError(
                f"a2a size {self.a2a} must divide query heads ({q.shape[2]}) and "
                f"KV heads ({k.shape[2]}) per rank"
            )
        return 1.0 / math.sqrt(q.shape[-1])

    def _attend(self, q, k, v, geometry, order=None):
        scale = self._check(q, k)
        if self.a2a > 1:
            q, k, v = (_SeqToHead.apply(t, self.a2a_group, self.a2a, order) for t in (q, k, v))
        out = _RingAttention.apply(q, k, v, self.ring, scale, geometry)
        if self.a2a > 1:
            out = _HeadToSeq.apply(out, self.a2a_group, self.a2a, order)
        return out

    def __call__(self, q, k, v):
        if q.shape[1] % 2:
            raise ValueError(f"per-rank sequence {q.shape[1]} must be even (two chunks)")
        # one document a sequence: after the all-to-all, chunks of a*S/2 tokens, all real
        chunk = self.a2a * q.shape[1] // 2
        return self._attend(q, k, v, ((2 * self.ring.size * chunk,), (chunk,)))


def build_ref_attention(groups, comm_type: str, *, cp_off: bool = False,
                        layer=RefHCPAttention) -> RefHCPAttention:
    """The reference layer for one layout; ``cp_off`` plants the silent failure. ``layer``:
    the class (or factory) built with the layout's groups (``packed`` passes its own)."""
    if cp_off or comm_type == "none":
        return layer()
    if comm_type == "p2p":
        return layer(ring=Ring.of(groups.cp))
    if comm_type == "a2a":
        return layer(a2a_group=groups.cp)
    if comm_type == "a2a+p2p":
        if not groups.hierarchical:
            raise RuntimeError(
                "a2a+p2p needs the HCP groups, but Megatron-Core has none "
                "(hierarchical_context_parallel_sizes not given)"
            )
        return layer(a2a_group=groups.a2a, ring=Ring.of(groups.p2p))
    raise ValueError(f"unknown comm type {comm_type!r}: expected none, p2p, a2a or a2a+p2p")
