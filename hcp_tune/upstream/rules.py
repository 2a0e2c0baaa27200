"""Every HCP rule once: its id, the Bridge fields it reads, its severity, where upstream
enforces it, and a check that returns what was found (with the arithmetic) and the exact
override that fixes it.

Who asks this table: ``layout.enumerate_layouts`` (why ``plan`` rejects or flags a layout),
``validate.check`` (findings on a Bridge config), ``config.SweepConfig`` (tp must divide the
heads) and ``costmodel._check`` (it predicts legal layouts only). A rule reads a ``Facts``
record, so a layout and a Bridge config are checked by the same code and report the same
id and fix. Pure functions over numbers: no torch, no files. Upstream sources read for
each rule are named in ``Rule.source`` (TE = TransformerEngine
``transformer_engine/pytorch/attention/dot_product_attention/``, BCFG = Megatron-Bridge
``src/megatron/bridge/training/config.py``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from hcp_tune.errors import ConfigError
from hcp_tune.spec import TE_MIN_HCP

Severity = Literal["error", "warning", "info"]
COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")  # TE's spellings; anything else raises
TE_THD_HCP = (2, 19)  # THD (packed) with a2a+p2p: asserted unsupported up to 2.18
TE_EVEN_HEADS = (2, 15)  # first TE whose backend selection needs even heads under a2a
SIZES_KEY = "model.hierarchical_context_parallel_sizes"
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What the rules read, in Bridge's terms; ``None`` where the input does not say."""

    cp: int = 1
    tp: int = 1
    seq: Optional[int] = None  # the sequence length that will run
    seq_key: str = "model.seq_length"  # where that length is set (named in fixes)
    heads: Optional[int] = None  # model.num_attention_heads
    kv_heads: Optional[int] = None  # model.num_query_groups (None: = heads)
    comm_types: tuple[str, ...] = ("p2p",)  # one entry, or one per layer
    per_layer: bool = False  # cp_comm_type was given as a per-layer list
    sizes: Optional[tuple[int, ...]] = None  # hierarchical_context_parallel_sizes
    num_layers: Optional[int] = None
    gpus_per_node: Optional[int] = None
    te: bool = True  # Transformer Engine runs the attention (Bridge always; a CPU trial not)
    te_version: Optional[tuple[int, ...]] = None  # None: not known
    packed: bool = False  # THD format (packed sequences)
    window_size: Optional[tuple[int, int]] = None
    softmax_type: str = "vanilla"
    position_embedding_type: Optional[str] = None
    decentralized_pg: bool = False
    model_seq: Optional[int] = None  # model.seq_length as written
    dataset_seq: Optional[int] = None  # dataset.seq_length as written
    resolved: bool = False  # the config is what runs (run_recipe.py --dry-run output)
    finetuning: bool = False
    per_token_loss: bool = False  # model.calculate_per_token_loss
    average_in_collective: bool = False  # ddp.average_in_collective
    drop_cross_node_a2a: bool = False
    pp: int = 1  # model.pipeline_model_parallel_size
    pp_plain: bool = True  # no uneven first/last stage, no layout, no account_for_* split

    @property
    def hcp(self) -> bool:
        return "a2a+p2p" in self.comm_types

    @property
    def a2a(self) -> int:
        """The all-to-all level's size: the first HCP size, or all of CP for plain a2a."""
        sizes = [self.cp] if "a2a" in self.comm_types else []
        if self.hcp and self.sizes and len(self.sizes) == 2:
            sizes.append(self.sizes[0])
        return max(sizes, default=1)

    @property
    def kv(self) -> Optional[int]:
        return self.kv_heads or self.heads

    def per_rank(self) -> Optional[tuple[int, int]]:
        """(query heads, KV heads) per TP rank, or None when unknown or not divisible."""
        if self.heads is None or self.heads % self.tp or self.kv % self.tp:
            return None
        return self.heads // self.tp, self.kv // self.tp


@dataclass(frozen=True)
class Finding:
    severity: Severity
    rule: str
    found: str
    fix: str = ""

    @property
    def text(self) -> str:
        return f"[{self.rule}] {self.found}" + (f"; fix: {self.fix}" if self.fix else "")


Check = Callable[[Facts], Optional[tuple[str, str]]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    reads: tuple[str, ...]  # Bridge fields
    means: str  # one line: what it means (README's table)
    source: str  # where upstream enforces it
    check: Check  # -> (what was found, the fix) or None
    layout: bool = False  # plan checks it on every candidate layout


# ------------------------------------------------------------------ fixes


def suggest_sizes(cp: int, tp: int, hq: int, hk: int, gpn: Optional[int]) -> Optional[list[int]]:
    """The largest a2a size < cp that splits the heads and stays inside a node."""
    for a in sorted((d for d in range(2, cp) if cp % d == 0), reverse=True):
        if hq % a == 0 and hk % a == 0 and (gpn is None or tp * a <= gpn):
            return [a, cp // a]
    return None


def sizes_fix(f: Facts) -> str:
    if f.cp == 1:
        return "model.cp_comm_type=p2p (context_parallel_size=1: nothing to split)"
    hq, hk = f.per_rank() or (f.cp, f.cp)
    s = suggest_sizes(f.cp, f.tp, hq, hk, f.gpus_per_node)
    if s is None:
        return "model.cp_comm_type=p2p (no a2a size fits the heads here)"
    return f'"{SIZES_KEY}=[{s[0]},{s[1]}]"'


def _a2a_works(f: Facts) -> bool:
    """Plain a2a over all of CP runs here (heads split by cp, even per rank under TE)."""
    r = f.per_rank()
    return bool(r) and all(n % f.cp == 0 and (n % 2 == 0 or not f.te) for n in r)


def _drop_sizes(f: Facts) -> str:
    return f" {SIZES_KEY}=null" if f.sizes else ""


# ------------------------------------------------------------------ checks


def _comm_type(f: Facts):
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


def _comm_type_layers(f: Facts):
    if not f.per_layer or f.cp == 1 or f.num_layers is None:
        return None
    if len(f.comm_types) == f.num_layers:
        return None
    one = set(f.comm_types)
    fix = (f"model.cp_comm_type={next(iter(one))} (one value applies to every layer)"
           if len(one) == 1 else f"give model.cp_comm_type one entry per layer ({f.num_layers})")
    return (f"model.cp_comm_type has {len(f.comm_types)} entries but num_layers = "
            f"{f.num_layers}: Bridge and Megatron-Core assert one entry per layer", fix)


def _silent_cp_off(f: Facts):
    if not f.hcp or f.sizes:
        return None
    return (f"model.cp_comm_type=a2a+p2p with context_parallel_size={f.cp} but no {SIZES_KEY}: "
            "Megatron-Core hands TE an empty hierarchical group, TE computes cp_size=1 and "
            f"each rank attends only to its own 1/{f.cp} of the sequence, with no error; it "
            "looks fast (Bridge #2667: >2x the GPU's peak TFLOP/s) and trains a wrong model. "
            "Bridge asserts the sizes are set whenever a layer uses a2a+p2p, at any CP size",
            sizes_fix(f))


def _two_levels(f: Facts):
    if not f.sizes or len(f.sizes) == 2:
        return None
    return (f"{SIZES_KEY}={list(f.sizes)}: {len(f.sizes)} levels; Transformer Engine runs "
            "exactly two ([a2a, p2p]: all-to-all inside, ring across)", sizes_fix(f))


def _sizes_product(f: Facts):
    if not f.sizes or math.prod(f.sizes) == f.cp:
        return None
    arith = " * ".join(f"{n}({v})" for n, v in zip(("a2a", "p2p", "l2", "l3"), f.sizes))
    return (f"{SIZES_KEY}={list(f.sizes)}: {arith} = {math.prod(f.sizes)} != "
            f"context_parallel_size({f.cp})", sizes_fix(f))


def _sizes_ignored(f: Facts):
    if not f.sizes or f.hcp:
        return None
    return (f"{SIZES_KEY}={list(f.sizes)} is set but cp_comm_type={'/'.join(f.comm_types)}: "
            "the sizes are used only by a2a+p2p, so they do nothing here",
            f"model.cp_comm_type=a2a+p2p to use them, or {SIZES_KEY}=null")


def _seq_divisible(f: Facts):
    if f.seq is None or f.cp == 1 or f.seq % (2 * f.cp) == 0:
        return None
    step = 2 * f.cp
    lo = f.seq // step * step
    return (f"seq {f.seq} is not divisible by 2*cp = {step} (load-balanced causal chunks: "
            f"CP rank i holds chunks i and 2*cp-1-i)",
            f"{f.seq_key}={lo + step}" + (f" (or {lo})" if lo else ""))


def _heads_tp(f: Facts):
    if f.heads is None or f.per_rank() is not None:
        return None
    best = max(d for d in range(1, f.tp + 1) if f.heads % d == 0 and f.kv % d == 0)
    return (f"tp={f.tp} does not divide the heads ({f.heads}) and KV heads ({f.kv}): "
            "Megatron-Core splits both across TP ranks",
            f"model.tensor_model_parallel_size={best}")


def _heads_a2a(f: Facts):
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


def _heads_even_a2a(f: Facts):
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
            "backend is left", "model.cp_comm_type=p2p" + _drop_sizes(f))


def _dims_unknown(f: Facts):
    missing = []
    if f.heads is None and f.a2a > 1:
        missing.append("head counts (model.num_attention_heads/num_query_groups): head "
                       "divisibility")
    if f.per_layer and f.num_layers is None and f.cp > 1:
        missing.append("model.num_layers: the per-layer cp_comm_type length")
    if not missing:
        return None
    return ("unknown " + "; ".join(missing) + " not checked",
            "give the missing fields, or model=NAME (an hcp-tune model spec)")


def _a2a_cross_node(f: Facts):
    if f.gpus_per_node is None or f.a2a == 1 or f.tp * f.a2a <= f.gpus_per_node:
        return None
    drop = " (dropped: drop_cross_node_a2a=true)" if f.drop_cross_node_a2a else ""
    return (f"a2a level crosses nodes: tp*a2a = {f.tp}*{f.a2a} = {f.tp * f.a2a} > "
            f"{f.gpus_per_node} GPUs per node, so its all-to-all runs on inter-node links{drop}",
            sizes_fix(f))


def _layers_pp(f: Facts):
    if f.pp == 1 or f.num_layers is None or not f.pp_plain or f.num_layers % f.pp == 0:
        return None
    best = max(d for d in range(1, f.pp + 1) if f.num_layers % d == 0)
    return (f"num_layers {f.num_layers} is not divisible by pipeline_model_parallel_size "
            f"{f.pp} ({f.num_layers} % {f.pp} = {f.num_layers % f.pp}): Megatron-Core asserts "
            "\"num_layers should be divisible by pipeline_model_parallel_size\"",
            f"model.pipeline_model_parallel_size={best}")


def _pp_stage_placement(f: Facts):
    block, g = f.tp * f.cp, f.gpus_per_node
    if f.pp == 1 or f.cp == 1 or g is None or block % g == 0 or g % block == 0:
        return None
    return (f"pipeline stages place their CP groups differently: a stage's CP groups are "
            f"blocks of tp*cp = {f.tp}*{f.cp} = {block} consecutive ranks, which neither "
            f"divides nor is a multiple of {g} GPUs per node, so some stages' groups cross "
            f"nodes where stage 0's (what the attention runner measures) may not",
            f"a tp*cp that divides {g} or is a multiple of it")


def _decentralized(f: Facts):
    if not f.decentralized_pg or not (f.hcp or f.sizes):
        return None
    return ("dist.use_decentralized_pg=true with hierarchical CP: Bridge raises "
            "NotImplementedError on the decentralized path when the sizes are set",
            "dist.use_decentralized_pg=false")


def _vtext(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _te_version(f: Facts):
    if not f.hcp or f.te_version is None or f.te_version >= TE_MIN_HCP:
        return None
    return (f"Transformer Engine {_vtext(f.te_version)} < {_vtext(TE_MIN_HCP)}, the first "
            "release with the a2a+p2p path (Megatron-Core asserts it)",
            f"use a container with Transformer Engine >= {_vtext(TE_MIN_HCP)}")


def _te_version_unknown(f: Facts):
    if not f.hcp or f.te_version is not None:
        return None
    return ("Transformer Engine's version is not known here, so the TE minimum was not checked",
            "pass te_version=X.Y.Z (the training container's TE) to check it")


def _te_thd(f: Facts):
    if not (f.hcp and f.packed and f.te_version is not None and f.te_version < TE_THD_HCP):
        return None
    return (f"packed sequences (THD) with a2a+p2p need Transformer Engine >= "
            f"{_vtext(TE_THD_HCP)} (asserted unsupported up to 2.18); found "
            f"{_vtext(f.te_version)}",
            f"use Transformer Engine >= {_vtext(TE_THD_HCP)}, or model.cp_comm_type=p2p")


def _sliding_window(f: Facts):
    w = f.window_size
    if f.cp == 1 or w is None or tuple(w) in ((-1, 0), (-1, -1)):
        return None
    bad = sorted({"p2p", "a2a+p2p"} & set(f.comm_types))
    if not bad:
        return None
    fix = "model.cp_comm_type=a2a" if _a2a_works(f) else "model.cp_comm_type=all_gather"
    return (f"model.window_size={list(w)} (sliding window) with cp_comm_type={'/'.join(bad)}: "
            "TE's context parallelism runs sliding windows only with a2a and all_gather",
            fix + _drop_sizes(f))


def _softmax_type(f: Facts):
    if f.cp == 1 or f.softmax_type == "vanilla" or set(f.comm_types) == {"a2a"}:
        return None
    fix = ("model.cp_comm_type=a2a" + _drop_sizes(f) if _a2a_works(f)
           else "model.softmax_type=vanilla")
    return (f"model.softmax_type={f.softmax_type} with cp_comm_type={'/'.join(f.comm_types)}: "
            "TE's context parallelism supports a non-vanilla softmax only with a2a "
            "(and the fused backend)", fix)


def _attention_bias(f: Facts):
    others = sorted(set(f.comm_types) - {"p2p"})
    if f.cp == 1 or f.position_embedding_type != "relative" or not others:
        return None
    return ("model.position_embedding_type=relative adds an attention bias; TE's context "
            f"parallelism runs a bias only with p2p, not {'/'.join(others)}",
            "model.cp_comm_type=p2p" + _drop_sizes(f))


def _seq_pair(f: Facts) -> bool:
    return None not in (f.model_seq, f.dataset_seq) and f.model_seq != f.dataset_seq


def _seq_dataset_wins(f: Facts):
    if f.resolved or not _seq_pair(f):
        return None
    return (f"model.seq_length={f.model_seq} but dataset.seq_length={f.dataset_seq}: "
            f"{f.dataset_seq} runs (Bridge's scripts/training/run_recipe.py copies the "
            "dataset's value into the model); launched any other way, Bridge asserts they match",
            f"model.seq_length={f.dataset_seq}")


def _seq_mismatch(f: Facts):
    if not f.resolved or not _seq_pair(f):
        return None
    return (f"model.seq_length={f.model_seq} != dataset.seq_length={f.dataset_seq} in a "
            "resolved config: ConfigContainer.validate asserts they match",
            f"model.seq_length={f.dataset_seq}")


def _loss_settings(f: Facts) -> Optional[tuple[str, str]]:
    if not f.finetuning or f.cp == 1 or (f.per_token_loss and not f.average_in_collective):
        return None
    now = (f"model.calculate_per_token_loss={str(f.per_token_loss).lower()}, "
           f"ddp.average_in_collective={str(f.average_in_collective).lower()}")
    return now, "model.calculate_per_token_loss=true ddp.average_in_collective=false"


def _finetune_runner(f: Facts):
    got = _loss_settings(f)
    if got is None or f.resolved:
        return None
    return (f"finetuning with CP={f.cp} and {got[0]}: Bridge's run_recipe.py (>= 0.6, mode "
            "sft/lora/dora) sets calculate_per_token_loss=true and average_in_collective=false "
            "itself, and those run; launched any other way, ConfigContainer.validate asserts",
            got[1])


def _finetune_cp_loss(f: Facts):
    got = _loss_settings(f)
    if got is None or not f.resolved:
        return None
    return (f"finetuning with CP={f.cp} and {got[0]} in a resolved config: these values run "
            "and ConfigContainer.validate asserts (all-masked ranks would give NaN loss)", got[1])


# ------------------------------------------------------------------ the table

M = "model."
RULES: tuple[Rule, ...] = (
    Rule("comm-type", "error", (M + "cp_comm_type",),
         "cp_comm_type is p2p, a2a, all_gather or a2a+p2p (`allgather` is not TE's spelling)",
         "TE context_parallel.py attn_forward_func_with_cp", _comm_type),
    Rule("comm-type-layers", "error", (M + "cp_comm_type", M + "num_layers"),
         "a per-layer cp_comm_type list has one entry per layer",
         "BCFG _validate_cp_comm_type; Megatron-Core transformer_config.py", _comm_type_layers),
    Rule("silent-cp-off", "error", (M + "cp_comm_type", SIZES_KEY),
         "a2a+p2p without sizes, at any CP: TE gets no group, computes cp_size=1 and every rank "
         "attends to its own chunk only, fast and wrong",
         "BCFG _validate_cp_comm_type; Megatron-Core TEDotProductAttention", _silent_cp_off),
    Rule("two-levels", "error", (SIZES_KEY,), "exactly two levels: TE runs [a2a, p2p] only",
         "TE context_parallel.py (cp_group = [a2a, p2p])", _two_levels),
    Rule("sizes-product", "error", (SIZES_KEY, M + "context_parallel_size"),
         "the sizes multiply to cp (whenever they are set)", "BCFG _validate_cp_comm_type",
         _sizes_product),
    Rule("sizes-ignored", "warning", (SIZES_KEY, M + "cp_comm_type"),
         "sizes without a2a+p2p do nothing", "TE / Megatron-Core (sizes read for a2a+p2p only)",
         _sizes_ignored),
    Rule("seq-divisible", "error", (M + "seq_length", "dataset.seq_length",
                                    M + "context_parallel_size"),
         "seq % (2*cp) == 0: load-balanced causal chunks (rank i holds chunks i and 2cp-1-i)",
         "BCFG validate; TE context_parallel.py", _seq_divisible, layout=True),
    Rule("heads-tp", "error", (M + "num_attention_heads", M + "num_query_groups",
                               M + "tensor_model_parallel_size"),
         "tp divides heads and KV heads: Megatron-Core splits both over TP",
         "Megatron-Core transformer_config.py", _heads_tp, layout=True),
    Rule("heads-a2a", "error", (M + "num_attention_heads", M + "num_query_groups", SIZES_KEY),
         "the a2a size divides the per-TP-rank heads and KV heads (pure a2a: cp divides them)",
         "TE context_parallel.py (a2a scatters heads; a shape error for a2a+p2p)", _heads_a2a,
         layout=True),
    Rule("heads-even-a2a", "error", (M + "num_attention_heads", M + "num_query_groups",
                                     M + "cp_comm_type"),
         "under a2a or a2a+p2p the per-TP-rank heads and KV heads are even (TE >= 2.15, sbhd)",
         "TE utils.py get_attention_backend (v2.15+, read at v2.17.1); context_parallel.py "
         "refuses FlashAttention with sbhd under CP", _heads_even_a2a, layout=True),
    Rule("dims-unknown", "info", (M + "num_attention_heads", M + "num_layers"),
         "the model's dimensions are needed for the head and layer rules", "-", _dims_unknown),
    Rule("a2a-cross-node", "warning", (M + "tensor_model_parallel_size", SIZES_KEY),
         "tp*a2a <= GPUs per node: the all-to-all should stay on NVLink",
         "placement (hcp-facts.md section 2)", _a2a_cross_node, layout=True),
    Rule("layers-pp", "error", (M + "num_layers", M + "pipeline_model_parallel_size"),
         "num_layers divisible by pp (the plain case: no uneven first/last stage, no "
         "pipeline layout, no account_for_*_in_pipeline_split)",
         "Megatron-Core transformer_block.py get_num_layers_to_build", _layers_pp, layout=True),
    Rule("pp-stage-placement", "warning", (M + "pipeline_model_parallel_size",
         M + "tensor_model_parallel_size", M + "context_parallel_size"),
         "with pp > 1, every stage's CP groups sit alike on nodes only when tp*cp divides "
         "or is a multiple of the GPUs per node",
         "placement: order tp-cp-ep-dp-pp (parallel_state.RankGenerator)", _pp_stage_placement,
         layout=True),
    Rule("decentralized-pg", "error", ("dist.use_decentralized_pg", SIZES_KEY),
         "dist.use_decentralized_pg=false with HCP", "Bridge training/initialize.py",
         _decentralized),
    Rule("te-version", "error", ("te_version",), "Transformer Engine >= 1.12 for a2a+p2p",
         "Megatron-Core extensions/transformer_engine.py", _te_version),
    Rule("te-version-unknown", "info", ("te_version",), "TE's version could not be checked",
         "-", _te_version_unknown),
    Rule("te-thd", "error", (M + "qkv_format", "dataset.packed_sequence_specs"),
         "packed (THD) with a2a+p2p needs TE >= 2.19",
         "TE context_parallel.py (asserted up to v2.18)", _te_thd),
    Rule("sliding-window", "error", (M + "window_size", M + "cp_comm_type"),
         "a sliding window runs with a2a and all_gather, not p2p or a2a+p2p; (-1,0) and "
         "(-1,-1) are not sliding", "TE context_parallel.py attn_forward_func_with_cp",
         _sliding_window),
    Rule("softmax-type", "error", (M + "softmax_type", M + "cp_comm_type"),
         "a non-vanilla softmax runs only with a2a", "TE context_parallel.py; utils.py",
         _softmax_type),
    Rule("attention-bias", "error", (M + "position_embedding_type", M + "cp_comm_type"),
         "an attention bias (relative position embedding) runs only with p2p",
         "TE utils.py get_attention_backend; context_parallel.py", _attention_bias),
    Rule("seq-dataset-wins", "warning", (M + "seq_length", "dataset.seq_length"),
         "model.seq_length differs from dataset.seq_length: the dataset's runs",
         "Bridge scripts/training/run_recipe.py (0.4+; recipe_runner.py in 0.6+)",
         _seq_dataset_wins),
    Rule("seq-mismatch", "error", (M + "seq_length", "dataset.seq_length"),
         "in a resolved config the two lengths are equal", "BCFG validate", _seq_mismatch),
    Rule("finetune-cp-loss-runner", "warning", (M + "calculate_per_token_loss",
                                                "ddp.average_in_collective", "dataset"),
         "finetuning with CP>1: run_recipe.py sets per-token loss and no in-collective "
         "averaging itself", "Bridge scripts/training/recipe_runner.py "
         "(sync_finetuning_cp_invariants, 0.6+)", _finetune_runner),
    Rule("finetune-cp-loss", "error", (M + "calculate_per_token_loss",
                                       "ddp.average_in_collective", "dataset"),
         "finetuning with CP>1 needs calculate_per_token_loss=true and "
         "average_in_collective=false", "BCFG validate", _finetune_cp_loss),
)
BY_ID = {r.id: r for r in RULES}
LAYOUT_RULES = tuple(r for r in RULES if r.layout)


def evaluate(facts: Facts, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """The findings of ``rules`` on ``facts``, errors first."""
    out = []
    for rule in rules:
        got = rule.check(facts)
        if got is not None:
            out.append(Finding(rule.severity, rule.id, *got))
    return sorted(out, key=lambda f: SEVERITY_ORDER[f.severity])


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.17.1+4329ff8`` -> (2, 17, 1); a ``ConfigError`` when there is no number."""
    nums = re.findall(r"\d+", str(text).split("+")[0])
    if not nums:
        raise ConfigError(f"te_version={text!r}: expected a version such as 2.9.0")
    return tuple(int(n) for n in nums[:3])
