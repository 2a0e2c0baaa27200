"""What every HCP rule is made of: the ``Facts`` a rule reads (a layout or a Bridge config,
in Bridge's terms), the ``Finding`` it returns, the ``Rule`` row of the table, and the fixes
several rules share (the sizes to suggest). The checks live by the upstream project whose
behaviour they restate (``te``, ``te_packed``, ``mcore``, ``bridge``); ``rules`` holds the table.
Pure functions over numbers: no torch, no files.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional

Severity = Literal["error", "warning", "info"]
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
    packed: bool = False  # THD format (packed sequences, Bridge's dataset packing)
    pad_between_seqs: Optional[bool] = None  # what TE is passed; None: TE detects it (Bridge 0.6)
    pad_multiple: Optional[int] = None  # each packed document padded to a multiple of it
    pad_overhead: Optional[float] = None  # the user's mix: padding tokens per real token
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
    def ring(self) -> tuple[str, ...]:
        """The comm types that run TE's ring (p2p) path, at cp > 1: p2p and a2a+p2p."""
        return tuple(sorted({"p2p", "a2a+p2p"} & set(self.comm_types))) if self.cp > 1 else ()

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


def a2a_works(f: Facts) -> bool:
    """Plain a2a over all of CP runs here (heads split by cp, even per rank under TE)."""
    r = f.per_rank()
    return bool(r) and all(n % f.cp == 0 and (n % 2 == 0 or not f.te) for n in r)


def drop_sizes(f: Facts) -> str:
    return f" {SIZES_KEY}=null" if f.sizes else ""
