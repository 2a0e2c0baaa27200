"""The proof that CP is active, run in every trial before timing.

On a small input (``verify_seq`` tokens) every rank runs the layout's attention forward and
backward on its load-balanced share (chunks j and 2cp-1-j of the sequence, its TP slice of
the heads). Rank 0 gathers out/dQ/dK/dV, puts them back in global sequence order and
compares them with a single-process run over the whole sequence. Two references:

- fp32 (the torch reference, CPU or GPU): causal attention computed in float64. Metric per
  tensor ``max|cp - ref| / max|ref|``, tolerance 1e-5.
- bf16/fp16 (the TE path): as TE checks itself (``tests/pytorch/attention/
  run_attention_with_cp.py``), the same attention without CP **in the same dtype** on rank
  0, inputs clamped to [-1, 1], and an elementwise ``assert_close`` with atol = rtol = 2.5e-2
  (bf16), 3.5e-2 (bf16 GQA), 5e-3 (fp16). A bf16 run compared with float64 would mix in
  the inputs' rounding and can fail a correct layout. Metric per tensor: the worst
  ``|cp - ref| - rtol*|ref|``, which passes exactly when it is <= atol (the tolerance).

If CP communication is skipped, each rank attends only to its own chunks and the error is
O(1): it cannot pass. Rank 0's verdict is broadcast to every rank.

Packed sequences (``spec.packing == "thd"``): the input is a packed stream of documents
(``proof_stream``: one long document, a tail-padded one, one shorter than ``2*cp`` that
leaves some ranks nothing but padding, an exact multiple of ``2*cp``, a one-token one),
each rank gets its per-document share (``packed.packed_share``: chunks r and 2cp-1-r of
every document), and the reference is causal attention **per document** on the gathered
stream: in float64 one document at a time, or the same packed attention without CP in the
same dtype. Only real tokens are compared: what a kernel leaves in padding is no output.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

TOLERANCE = {"fp32": 1e-5, "bf16": 2.5e-2, "fp16": 5e-3}
GQA_BF16_TOLERANCE = 3.5e-2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VERIFY_TOKENS_PER_CHUNK = 8  # default verify_seq = 2*cp*8: tiny, but every block kind occurs
# TE's kernels are checked at TE-test-like lengths (its CP tests use thousands of tokens;
# some backends want the per-rank length a multiple of 64): 2*cp*128 tokens, cheap on a GPU
TE_VERIFY_TOKENS_PER_CHUNK = 128


def tolerance(dtype: str, gqa: bool) -> float:
    if dtype == "bf16" and gqa:
        return GQA_BF16_TOLERANCE
    return TOLERANCE[dtype]


def verify_seq_for(spec, same_dtype: bool = False) -> int:
    per_chunk = TE_VERIFY_TOKENS_PER_CHUNK if same_dtype else VERIFY_TOKENS_PER_CHUNK
    return spec.verify_seq or 2 * spec.cp * per_chunk


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


def proof_stream(spec, same_dtype: bool = False):
    """The packed proof's documents for ``spec.cp`` (``u = 2*cp``, ``n`` tokens a chunk as
    the fixed-length proof): every case a per-document partition meets, about ``u*n``
    tokens in all."""
    from hcp_tune.job.attention.packed import PackedStream

    u = 2 * spec.cp
    n = verify_seq_for(spec, same_dtype) // u
    docs = (u * n // 2 + 1,  # long, every rank's chunks, tail-padded
            max(1, u - 1),  # shorter than 2*cp: some ranks hold only padding
            u * max(1, n // 4),  # an exact multiple: no padding
            1,  # one token
            u * max(1, n // 4) + u // 2 + 1)  # padded, ends in mid chunk
    return PackedStream(docs, spec.cp)


def make_inputs(spec, seq: int, seed: int, batch: Optional[int] = None
                ) -> dict[str, torch.Tensor]:
    """Global q, k, v, dout (fp32, CPU), identical on every rank (same seed); ``batch``
    sequences (default ``spec.mbs``; a packed stream is one)."""
    g = torch.Generator().manual_seed(seed)
    b = spec.mbs if batch is None else batch
    shape_q = (b, seq, spec.heads, spec.head_dim)
    shape_kv = (b, seq, spec.kv_heads, spec.head_dim)
    # clamped as in TE's CP test: no outliers for the low-precision comparison to trip on
    return {n: torch.randn(shape, generator=g).clamp(-1, 1)
            for n, shape in (("q", shape_q), ("k", shape_kv), ("v", shape_kv), ("dout", shape_q))}


def to_format(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """bshd -> ``fmt`` (sbhd, bshd, or thd for a packed stream: b = 1), contiguous as a
    kernel wants it."""
    if fmt == "thd":
        return x[0]
    return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x


def from_format(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``fmt`` -> bshd (a view: only read back)."""
    if fmt == "thd":
        return x.unsqueeze(0)
    return x.transpose(0, 1) if fmt == "sbhd" else x


def local_share(x: torch.Tensor, spec, *, tp_rank: int, cp_pos: int,
                stream=None) -> torch.Tensor:
    """This rank's slice: its TP heads (dim 2) and its CP share (dim 1): load-balanced
    chunks, or with a packed ``stream`` its chunks of every document."""
    per = x.shape[2] // spec.tp
    x = x[:, :, tp_rank * per : (tp_rank + 1) * per]
    if stream is not None:
        from hcp_tune.job.attention import packed

        return packed.packed_share(x, stream, cp_pos)
    return load_balanced(x, spec.cp, cp_pos)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item() or 1.0
    return (got.double() - ref.double()).abs().max().item() / scale


def excess_err(got: torch.Tensor, ref: torch.Tensor, rtol: float) -> float:
    """max(|got - ref| - rtol*|ref|): <= atol exactly when ``assert_close(atol, rtol)`` holds."""
    got, ref = got.double(), ref.double()
    return ((got - ref).abs() - rtol * ref.abs()).max().item()


def _run(attn: Callable, ins: dict[str, torch.Tensor], fmt: str, device, tdt, stream=None
         ) -> dict[str, torch.Tensor]:
    """Forward + backward of ``attn`` on bshd inputs; out/dq/dk/dv back in bshd on the CPU.
    A packed layer is called with the ``stream`` its tokens come from."""
    x = {n: to_format(t, fmt).to(device=device, dtype=tdt) for n, t in ins.items()}
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = attn(q, k, v) if stream is None else attn(q, k, v, stream)
    out.backward(x["dout"])
    got = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {n: from_format(t, fmt).float().cpu() for n, t in got.items()}


def verify_cp(spec, attn: Callable, *, tp_rank: int, cp_pos: int, device, dtype: str,
              reference: Optional[Callable[[], Callable]] = None, stream=None
              ) -> dict[str, Any]:
    """Collective over the world group. Returns rank 0's evidence on every rank.

    ``reference`` builds the same attention without CP (called on rank 0 only); given, the
    CP run is compared with it in the same dtype, else with float64 causal attention.
    Packed (``spec.packing == "thd"``): on ``stream`` (default ``proof_stream``).
    """
    same_dtype = reference is not None
    if spec.packing == "thd":
        stream = stream or proof_stream(spec, same_dtype)
        seq = stream.tokens
        glob = make_inputs(spec, seq, spec.seed, batch=1)
    else:
        stream = None
        seq = verify_seq_for(spec, same_dtype)
        glob = make_inputs(spec, seq, spec.seed)
    fmt = getattr(attn, "qkv_format", "bshd")
    mine = {n: local_share(t, spec, tp_rank=tp_rank, cp_pos=cp_pos, stream=stream)
            for n, t in glob.items()}
    # the data-parallel replica (Megatron's order tp-cp-ep-dp-pp: rank = tp + tp*(cp + cp*d));
    # every replica runs the proof at once, on the same inputs, and each is compared
    replica = dist.get_rank() // (spec.tp * spec.cp)
    local = {"tp": tp_rank, "cp": cp_pos, "dp": replica,
             **_run(attn, mine, fmt, device, DTYPES[dtype], stream)}
    gathered: list = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(local, gathered, dst=0)
    verdict = [None]
    if dist.get_rank() == 0:
        if same_dtype:
            ref_attn = reference()
            refs = _run(ref_attn, glob, getattr(ref_attn, "qkv_format", "bshd"), device,
                        DTYPES[dtype], stream)
            if stream is not None:
                refs = {n: t[:, stream.valid] for n, t in refs.items()}
        elif stream is not None:
            refs = _packed_float64_reference(glob, stream)
        else:
            refs = _float64_reference(glob)
        verdict[0] = _compare(spec, refs, gathered, seq, dtype, same_dtype, stream)
        if stream is not None:
            verdict[0]["docs"] = list(stream.docs)
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def _float64_reference(glob: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    ref_in = {n: glob[n].double().requires_grad_() for n in ("q", "k", "v")}
    ref_out = full_causal_attention(ref_in["q"], ref_in["k"], ref_in["v"])
    ref_out.backward(glob["dout"].double())
    return {"out": ref_out.detach(), "dq": ref_in["q"].grad, "dk": ref_in["k"].grad,
            "dv": ref_in["v"].grad}


def _packed_float64_reference(glob: dict[str, torch.Tensor], stream
                              ) -> dict[str, torch.Tensor]:
    """Causal attention within each document of the padded stream, on its real tokens
    only, in float64: the results of all documents, real tokens in stream order."""
    per_doc = []
    for start, length in zip(stream.cu_seqlens(padded=True), stream.docs):
        per_doc.append(_float64_reference(
            {n: t[:, start : start + length] for n, t in glob.items()}))
    return {n: torch.cat([r[n] for r in per_doc], dim=1) for n in per_doc[0]}


def _unshare(pieces: list[torch.Tensor], spec, stream) -> torch.Tensor:
    """CP pieces (position order) back into one sequence or packed stream."""
    if stream is None:
        return undo_load_balance(pieces, spec.cp)
    from hcp_tune.job.attention import packed

    return packed.packed_unshare(pieces, stream)


def _compare(spec, refs, gathered, seq, dtype, same_dtype: bool, stream=None
             ) -> dict[str, Any]:
    """Every replica's and TP rank's CP pieces back in stream order, against ``refs``; with
    a packed ``stream`` the pieces are documents' chunks and only real tokens count (the
    references hold those only)."""
    tol = tolerance(dtype, spec.kv_heads != spec.heads)
    errors = {}
    replicas = sorted({g.get("dp", 0) for g in gathered})
    for name, ref in refs.items():
        worst = float("-inf")
        for d in replicas:  # every data-parallel replica must pass; the worst one is kept
            per_tp = []
            for t in range(spec.tp):
                pieces = sorted((g for g in gathered if g["tp"] == t and g.get("dp", 0) == d),
                                key=lambda g: g["cp"])
                if [g["cp"] for g in pieces] != list(range(spec.cp)):
                    raise RuntimeError(f"verification: replica {d} TP rank {t} lacks CP "
                                       f"positions: {[g['cp'] for g in pieces]}")
                per_tp.append(_unshare([g[name] for g in pieces], spec, stream))
            got = torch.cat(per_tp, dim=2)
            if stream is not None:
                got = got[:, stream.valid]
            err = excess_err(got, ref, tol) if same_dtype else rel_err(got, ref)
            worst = max(worst, float(err))
        errors[name] = worst
    passed = all(e <= tol for e in errors.values())
    metric = (f"max(|cp - nocp| - rtol*|nocp|) per tensor (assert_close, atol = rtol = "
              f"tolerance), nocp = the same attention without CP in {dtype}"
              if same_dtype else
              "max|cp - full| / max|full| per tensor, full = single-process float64")
    return {
        "passed": passed,
        "seq": seq,
        "metric": metric,
        "reference": (f"no-CP {dtype}" if same_dtype else "float64")
        + (" per document" if stream is not None else ""),
        "tolerance": tol,
        "dtype": dtype,
        "errors": errors,
    }
