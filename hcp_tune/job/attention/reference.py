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


def _chunks(owner: int, p: int) -> tuple[int, int]:
    return owner, 2 * p - 1 - owner


def _ring_forward(q, k, v, ring: Ring, scale: float):
    p, me = ring.size, ring.index
    rep = q.shape[2] // k.shape[2]
    c = q.shape[1] // 2
    qs = (q[:, :c], q[:, c:])
    outs = [torch.zeros_like(x) for x in qs]
    lses = [torch.full((q.shape[0], q.shape[2], c), float("-inf"), dtype=q.dtype, device=q.device)
            for _ in qs]
    kv = torch.stack([k, v])
    for step in range(p):
        owner = (me - step) % p
        if step < p - 1:
            nxt, reqs = _exchange(kv, ring)
        kk, vv = _expand(kv[0], rep), _expand(kv[1], rep)
        for qi, qc in enumerate(_chunks(me, p)):
            for ki, kc in enumerate(_chunks(owner, p)):
                rel = _relation(qc, kc)
                if rel is None:
                    continue
                ks = slice(ki * c, (ki + 1) * c)
                bout, blse = _block_forward(qs[qi], kk[:, ks], vv[:, ks], scale, rel)
                outs[qi], lses[qi] = _merge(outs[qi], lses[qi], bout, blse)
        if step < p - 1:
            _wait(reqs)
            kv = nxt
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def _ring_backward(q, k, v, out, lse, dout, ring: Ring, scale: float):
    p, me = ring.size, ring.index
    rep = q.shape[2] // k.shape[2]
    c = q.shape[1] // 2
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
        for qi, qc in enumerate(_chunks(me, p)):
            qsl = slice(qi * c, (qi + 1) * c)
            for ki, kc in enumerate(_chunks(owner, p)):
                rel = _relation(qc, kc)
                if rel is None:
                    continue
                ks = slice(ki * c, (ki + 1) * c)
                bdq, bdk, bdv = _block_backward(
                    q[:, qsl], kk[:, ks], vv[:, ks], dout[:, qsl],
                    lse[:, :, qsl], delta[:, :, qsl], scale, rel,
                )
                dq[:, qsl] += bdq
                dkk[:, ks] += bdk
                dvv[:, ks] += bdv
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
    def forward(ctx, q, k, v, ring: Ring, scale: float):
        out, lse = _ring_forward(q, k, v, ring, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.scale = ring, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.ring, ctx.scale)
        return dq, dk, dv, None, None


# ---------------------------------------------------------------- all-to-all


def _seq_to_head(x: torch.Tensor, group, a: int) -> torch.Tensor:
    """[b, S, h, d] -> [b, a*S, h/a, d]: gather the a2a group's sequences, keep my heads."""
    b, s, h, d = x.shape
    send = x.reshape(b, s, a, h // a, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    comm_delay("a2a")  # HCP_TUNE_INJECT_DELAY=a2a:S (a testing aid, off by default)
    dist.all_to_all_single(recv, send, group=group)  # recv[m]: member m's tokens
    half = s // 2
    first = [recv[m, :, :half] for m in range(a)]  # chunks ka .. ka+a-1
    second = [recv[m, :, half:] for m in reversed(range(a))]  # their mirrors, ascending
    return torch.cat(first + second, dim=1)


def _head_to_seq(y: torch.Tensor, group, a: int) -> torch.Tensor:
    """The inverse of ``_seq_to_head``: [b, a*S, h/a, d] -> [b, S, h, d]."""
    b, s2, hh, d = y.shape
    half = s2 // (2 * a)
    first = y[:, : s2 // 2].reshape(b, a, half, hh, d)
    second = y[:, s2 // 2 :].reshape(b, a, half, hh, d).flip(1)
    send = torch.cat([first, second], dim=2).transpose(0, 1).contiguous()  # [a, b, S, hh, d]
    recv = torch.empty_like(send)
    comm_delay("a2a")
    dist.all_to_all_single(recv, send, group=group)  # recv[m]: my tokens, member m's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, 2 * half, a * hh, d)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, a):
        ctx.group, ctx.a = group, a
        return _seq_to_head(x, group, a)

    @staticmethod
    def backward(ctx, g):  # a permutation: its adjoint is its inverse
        return _head_to_seq(g.contiguous(), ctx.group, ctx.a), None, None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, a):
        ctx.group, ctx.a = group, a
        return _head_to_seq(y, group, a)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_head(g.contiguous(), ctx.group, ctx.a), None, None


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

    def __call__(self, q, k, v):
        if q.shape[1] % 2:
            raise ValueError(f"per-rank sequence {q.shape[1]} must be even (two chunks)")
        if q.shape[2] % self.a2a or k.shape[2] % self.a2a:
            raise ValueError(
                f"a2a size {self.a2a} must divide query heads ({q.shape[2]}) and "
                f"KV heads ({k.shape[2]}) per rank"
            )
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.a2a > 1:
            q, k, v = (_SeqToHead.apply(t, self.a2a_group, self.a2a) for t in (q, k, v))
        out = _RingAttention.apply(q, k, v, self.ring, scale)
        if self.a2a > 1:
            out = _HeadToSeq.apply(out, self.a2a_group, self.a2a)
        return out


def build_ref_attention(groups, comm_type: str, *, cp_off: bool = False) -> RefHCPAttention:
    """The reference layer for one layout; ``cp_off`` plants the silent failure."""
    if cp_off or comm_type == "none":
        return RefHCPAttention()
    if comm_type == "p2p":
        return RefHCPAttention(ring=Ring.of(groups.cp))
    if comm_type == "a2a":
        return RefHCPAttention(a2a_group=groups.cp)
    if comm_type == "a2a+p2p":
        if not groups.hierarchical:
            raise RuntimeError(
                "a2a+p2p needs the HCP groups, but Megatron-Core has none "
                "(hierarchical_context_parallel_sizes not given)"
            )
        return RefHCPAttention(a2a_group=groups.a2a, ring=Ring.of(groups.p2p))
    raise ValueError(f"unknown comm type {comm_type!r}: expected none, p2p, a2a or a2a+p2p")
