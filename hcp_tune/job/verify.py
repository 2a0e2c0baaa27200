"""The proof that CP is active, run in every trial before timing.

On a small input (``verify_seq`` tokens) every rank runs the layout's attention forward and
backward on its load-balanced share (chunks j and 2cp-1-j of the sequence, its TP slice of
the heads). Rank 0 gathers out/dQ/dK/dV, puts them back in global sequence order and
compares them with single-process causal attention computed in float64.

Metric per tensor: ``max|cp - ref| / max|ref|`` (max-abs error relative to the tensor's
largest magnitude). Tolerances: fp32 1e-5; bf16 2.5e-2 (3.5e-2 with GQA) and fp16 5e-3, as
TE's own CP tests use. If CP communication is skipped, each rank attends only to its own
chunks and the error is O(1): it cannot pass. Rank 0's verdict is broadcast to every rank.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist

TOLERANCE = {"fp32": 1e-5, "bf16": 2.5e-2, "fp16": 5e-3}
GQA_BF16_TOLERANCE = 3.5e-2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VERIFY_TOKENS_PER_CHUNK = 8  # default verify_seq = 2*cp*8: tiny, but every block kind occurs


def tolerance(dtype: str, gqa: bool) -> float:
    if dtype == "bf16" and gqa:
        return GQA_BF16_TOLERANCE
    return TOLERANCE[dtype]


def verify_seq_for(spec) -> int:
    return spec.verify_seq or 2 * spec.cp * VERIFY_TOKENS_PER_CHUNK


def load_balanced(x: torch.Tensor, cp: int, pos: int) -> torch.Tensor:
    """CP rank ``pos``'s share of the sequence (dim 1): chunks pos and 2cp-1-pos of 2cp."""
    chunks = x.chunk(2 * cp, dim=1)
    return torch.cat([chunks[pos], chunks[2 * cp - 1 - pos]], dim=1)


def undo_load_balance(pieces: list[torch.Tensor], cp: int) -> torch.Tensor:
    """Inverse of ``load_balanced``: pieces[pos] back into one sequence in global order."""
    chunks: list = [None] * (2 * cp)
    for pos, piece in enumerate(pieces):
        first, second = piece.chunk(2, dim=1)
        chunks[pos], chunks[2 * cp - 1 - pos] = first, second
    return torch.cat(chunks, dim=1)


def full_causal_attention(q, k, v):
    """Single-process causal attention, bshd, GQA by repeating KV heads."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    n = q.shape[1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


def make_inputs(spec, seq: int, seed: int) -> dict[str, torch.Tensor]:
    """Global q, k, v, dout (fp32, CPU), identical on every rank (same seed)."""
    g = torch.Generator().manual_seed(seed)
    shape_q = (spec.mbs, seq, spec.heads, spec.head_dim)
    shape_kv = (spec.mbs, seq, spec.kv_heads, spec.head_dim)
    return {
        "q": torch.randn(shape_q, generator=g),
        "k": torch.randn(shape_kv, generator=g),
        "v": torch.randn(shape_kv, generator=g),
        "dout": torch.randn(shape_q, generator=g),
    }


def local_share(x: torch.Tensor, spec, *, tp_rank: int, cp_pos: int) -> torch.Tensor:
    """This rank's slice: its TP heads (dim 2) and its load-balanced chunks (dim 1)."""
    per = x.shape[2] // spec.tp
    return load_balanced(x[:, :, tp_rank * per : (tp_rank + 1) * per], spec.cp, cp_pos)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item() or 1.0
    return (got.double() - ref.double()).abs().max().item() / scale


def verify_cp(spec, attn: Callable, *, tp_rank: int, cp_pos: int, device, dtype: str
              ) -> dict[str, Any]:
    """Collective over the world group. Returns rank 0's evidence on every rank."""
    seq = verify_seq_for(spec)
    glob = make_inputs(spec, seq, spec.seed)
    tdt = DTYPES[dtype]
    mine = {n: local_share(t, spec, tp_rank=tp_rank, cp_pos=cp_pos).to(device=device, dtype=tdt)
            for n, t in glob.items()}
    q, k, v = (mine[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = attn(q, k, v)
    out.backward(mine["dout"])
    local = {"tp": tp_rank, "cp": cp_pos,
             "out": out.detach().float().cpu(), "dq": q.grad.float().cpu(),
             "dk": k.grad.float().cpu(), "dv": v.grad.float().cpu()}
    gathered: list = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(local, gathered, dst=0)
    verdict = [None]
    if dist.get_rank() == 0:
        verdict[0] = _compare(spec, glob, gathered, seq, dtype)
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def _compare(spec, glob, gathered, seq, dtype) -> dict[str, Any]:
    ref_in = {n: glob[n].double().requires_grad_() for n in ("q", "k", "v")}
    ref_out = full_causal_attention(ref_in["q"], ref_in["k"], ref_in["v"])
    ref_out.backward(glob["dout"].double())
    refs = {"out": ref_out.detach(), "dq": ref_in["q"].grad, "dk": ref_in["k"].grad,
            "dv": ref_in["v"].grad}
    tol = tolerance(dtype, spec.kv_heads != spec.heads)
    errors = {}
    for name, ref in refs.items():
        per_tp = []
        for t in range(spec.tp):
            pieces = sorted((g for g in gathered if g["tp"] == t), key=lambda g: g["cp"])
            if [g["cp"] for g in pieces] != list(range(spec.cp)):
                raise RuntimeError(f"verification: TP rank {t} lacks CP positions: "
                                   f"{[g['cp'] for g in pieces]}")
            per_tp.append(undo_load_balance([g[name] for g in pieces], spec.cp))
        errors[name] = rel_err(torch.cat(per_tp, dim=2), ref)
    passed = all(e <= tol for e in errors.values())
    return {
        "passed": passed,
        "seq": seq,
        "metric": "max|cp - full| / max|full| per tensor, full = single-process float64",
        "tolerance": tol,
        "dtype": dtype,
        "errors": errors,
    }
