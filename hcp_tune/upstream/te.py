"""The HCP rules that restate Transformer Engine
(``transformer_engine/pytorch/attention/dot_product_attention/``: ``context_parallel.py``,
``utils.py``): the communication types it accepts, its two levels, the load-balanced causal
chunks, how a2a scatters heads, the backends left under CP, its version floors and the
features its context parallelism runs with only some types (packed sequences: ``te_packed``).
Each check returns (what was found, the fix) or None; ``rules`` puts them in the table.
"""
from __future__ import annotations


from hcp_tune.spec import TE_MIN_HCP
from hcp_tune.upstream.facts import SIZES_KEY, Facts, a2a_works, drop_sizes, sizes_fix

COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")  # TE's spellings; anything else raises
TE_EVEN_HEADS = (2, 15)  # first TE whose backend selection needs even heads under a2a


def comm_type(f: Facts):
    bad = [t for t in f.comm_types if t not in COMM_TYPES]
    if f.cp == 1 or not bad:
        return None
    fixed = ["all_gather" if t.replace("_", "").lower() == "allgather" else
             t if t in COMM_TYPES else "p2p" for t in f.comm_types]
    fix = (f"model.cp_comm_type=[{','.join(fixed)}]" if f.per_layer else
           f"model.cp_comm_type={fixed[0]}")
    if fixed[f.comm_types.index(bad[0])] == "p2p":
        fix += " (or a2a, all_gather, a2a+p2p)"
    return (f"model.cp_comm_type={bad[0]!r}: Transformer Engine raises 'Unsupported "
            f"communication type'; it accepts {', '.join(COMM_TYPES)}", fix)


def two_levels(f: Facts):
    if not f.sizes or len(f.sizes) == 2:
        return None
    return (f"{SIZES_KEY}={list(f.sizes)}: {len(f.sizes)} levels; Transformer Engine runs "
            "exactly two ([a2a, p2p]: all-to-all inside, ring across)", sizes_fix(f))


def seq_divisible(f: Facts):
    if f.seq is None or f.cp == 1 or f.seq % (2 * f.cp) == 0:
        return None
    step = 2 * f.cp
    lo = f.seq // step * step
    return (f"seq {f.seq} is not divisible by 2*cp = {step} (load-balanced causal chunks: "
            f"CP rank i holds chunks i and 2*cp-1-i)",
            f"{f.seq_key}={lo + step}" + (f" (or {lo})" if lo else ""))


def heads_a2a(f: Facts):
    r = f.per_rank()
    if r is None or f.a2a == 1:
        return None
    bad = [f"{what} heads/tp = {n * f.tp}/{f.tp} = {n}"
           for what, n in (("query", r[0]), ("KV", r[1])) if n % f.a2a]
    if not bad:
        return None
    fix = sizes_fix(f)
    if not f.hcp and fix.startswith('"'):
        fix = f"model.cp_comm_type=a2a+p2p {fix}"
    return (f"a2a size {f.a2a} does not divide the per-TP-rank {' and '.join(bad)}: TE "
            "scatters heads over the a2a group (a shape error otherwise)", fix)


def heads_even_a2a(f: Facts):
    r = f.per_rank()
    on = {"a2a", "a2a+p2p"} & set(f.comm_types)
    if r is None or f.cp == 1 or not f.te or f.packed or not on or all(n % 2 == 0 for n in r):
        return None
    if f.te_version is not None and f.te_version < TE_EVEN_HEADS:
        return None
    odd = " and ".join(f"{w} heads/tp = {n * f.tp}/{f.tp} = {n}"
                       for w, n in (("query", r[0]), ("KV", r[1])) if n % 2)
    return (f"odd per-TP-rank {odd} with cp_comm_type={'/'.join(sorted(on))}: TE >= 2.15 "
            "turns its fused backend off (it needs both counts even under a2a), and with the "
            "sbhd format Megatron-Core uses TE refuses FlashAttention under CP: no attention "
            "backend is left", "model.cp_comm_type=p2p" + drop_sizes(f))


def vtext(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def te_version(f: Facts):
    if not f.hcp or f.te_version is None or f.te_version >= TE_MIN_HCP:
        return None
    return (f"Transformer Engine {vtext(f.te_version)} < {vtext(TE_MIN_HCP)}, the first "
            "release with the a2a+p2p path (Megatron-Core asserts it)",
            f"use a container with Transformer Engine >= {vtext(TE_MIN_HCP)}")


def te_version_unknown(f: Facts):
    if not f.hcp or f.te_version is not None or (f.packed and f.te and f.cp > 1):
        return None  # packed: rule thd-te-unknown says what the version decides
    return ("Transformer Engine's version is not known here, so the TE minimum was not checked",
            "pass te_version=X.Y.Z (the training container's TE) to check it")


def sliding_window(f: Facts):
    w = f.window_size
    if f.cp == 1 or w is None or tuple(w) in ((-1, 0), (-1, -1)):
        return None
    bad = sorted({"p2p", "a2a+p2p"} & set(f.comm_types))
    if not bad:
        return None
    fix = "model.cp_comm_type=a2a" if a2a_works(f) else "model.cp_comm_type=all_gather"
    return (f"model.window_size={list(w)} (sliding window) with cp_comm_type={'/'.join(bad)}: "
            "TE's context parallelism runs sliding windows only with a2a and all_gather",
            fix + drop_sizes(f))


def softmax_type(f: Facts):
    if f.cp == 1 or f.softmax_type == "vanilla" or set(f.comm_types) == {"a2a"}:
        return None
    fix = ("model.cp_comm_type=a2a" + drop_sizes(f) if a2a_works(f)
           else "model.softmax_type=vanilla")
    return (f"model.softmax_type={f.softmax_type} with cp_comm_type={'/'.join(f.comm_types)}: "
            "TE's context parallelism supports a non-vanilla softmax only with a2a "
            "(and the fused backend)", fix)


def attention_bias(f: Facts):
    others = sorted(set(f.comm_types) - {"p2p"})
    if f.cp == 1 or f.position_embedding_type != "relative" or not others:
        return None
    return ("model.position_embedding_type=relative adds an attention bias; TE's context "
            f"parallelism runs a bias only with p2p, not {'/'.join(others)}",
            "model.cp_comm_type=p2p" + drop_sizes(f))
