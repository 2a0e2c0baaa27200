"""``validate``: check a user's Bridge config against every HCP rule, with the fix.

Input is a Bridge run config (YAML, as Bridge saves it: sections ``model``, ``dist``,
``dataset`` ...) and/or Bridge-style overrides (``model.cp_comm_type=a2a+p2p``). Each
finding names its rule, what was found (with the arithmetic), and the exact override that
fixes it. No torch: Transformer Engine's version is read from package metadata.
"""
from __future__ import annotations

import importlib.metadata
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from hcp_tune.cluster import ClusterProfile
from hcp_tune.errors import ConfigError, InputFileError
from hcp_tune.model import ModelSpec

BRIDGE_SECTIONS = (
    "model", "dist", "train", "dataset", "logger", "tokenizer", "checkpoint", "optimizer",
    "scheduler", "ddp", "mixed_precision", "rng", "profiling", "comm_overlap",
)
COMM_TYPES = ("p2p", "a2a", "allgather", "all_gather", "a2a+p2p")
TE_MIN_HCP = (1, 12, 0)  # first TE with the a2a+p2p path; Megatron-Core asserts it
TE_MAX_NO_THD = (2, 18)  # THD (packed) with a2a+p2p needs a TE newer than the 2.18 line
SIZES_KEY = "model.hierarchical_context_parallel_sizes"


@dataclass(frozen=True)
class Finding:
    severity: Literal["error", "warning", "info"]
    rule: str
    found: str
    fix: str = ""


def read_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"config={path}: no such file; expected a Bridge run config YAML")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"config={path}: cannot read it ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputFileError(f"config={path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise InputFileError(
            f"config={path}: expected a mapping with sections such as model: and dist:, "
            f"got {type(data).__name__}"
        )
    return data


def is_bridge_override(arg: str) -> bool:
    key = arg.lstrip("+").split("=", 1)[0]
    return "." in key and key.split(".", 1)[0] in BRIDGE_SECTIONS


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed as YAML, as Hydra would)."""
    for arg in overrides:
        key, sep, raw = arg.lstrip("+").partition("=")
        if not sep or not key:
            raise ConfigError(f"malformed override {arg!r}: expected section.key=value")
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            raise ConfigError(f"{key}={raw!r}: not a valid value (YAML/Hydra syntax)") from None
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{arg}: {part} is not a section in the config")
        node[leaf] = value
    return tree


def _get(tree: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _int(tree: dict[str, Any], key: str, default: Optional[int]) -> Optional[int]:
    value = _get(tree, key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r}: expected an integer >= 1")
    return value


def installed_te_version() -> Optional[str]:
    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_tuple(text: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", str(text).split("+")[0])
    if not nums:
        raise ConfigError(f"te_version={text!r}: expected a version such as 2.9.0")
    return tuple(int(n) for n in nums[:3])


def suggest_sizes(cp: int, tp: int, hq: int, hk: int, gpn: Optional[int]) -> Optional[list[int]]:
    """The largest a2a size < cp that splits the heads and stays inside a node."""
    for a in sorted((d for d in range(2, cp) if cp % d == 0), reverse=True):
        if hq % a == 0 and hk % a == 0 and (gpn is None or tp * a <= gpn):
            return [a, cp // a]
    return None


def _sizes_fix(cp, tp, hq, hk, gpn) -> str:
    s = suggest_sizes(cp, tp, hq or cp, hk or cp, gpn)
    if s is None:
        return "model.cp_comm_type=p2p (no a2a size fits the heads here)"
    return f'"{SIZES_KEY}=[{s[0]},{s[1]}]"'


def check(
    tree: dict[str, Any],
    *,
    model: Optional[ModelSpec] = None,
    cluster: Optional[ClusterProfile] = None,
    te_version: Optional[str] = None,
) -> list[Finding]:
    """Every HCP rule over a Bridge config tree; the findings, errors first."""
    out: list[Finding] = []
    cp = _int(tree, "model.context_parallel_size", 1)
    tp = _int(tree, "model.tensor_model_parallel_size", 1)
    seq = _int(tree, "model.seq_length", None)
    heads = _int(tree, "model.num_attention_heads", model.heads if model else None)
    kv = _int(tree, "model.num_query_groups", model.kv_heads if model else None) or heads
    comm = _get(tree, "model.cp_comm_type")
    sizes = _get(tree, SIZES_KEY)
    gpn = cluster.gpus_per_node if cluster else None
    types = set(comm) if isinstance(comm, list) else {comm or "p2p"}
    bad_types = sorted(t for t in types if t not in COMM_TYPES)
    if bad_types:
        raise ConfigError(
            f"model.cp_comm_type={bad_types[0]!r}: expected one of {', '.join(COMM_TYPES)}"
        )
    hcp = "a2a+p2p" in types
    hq_rank = heads // tp if heads and heads % tp == 0 else None
    hk_rank = kv // tp if kv and kv % tp == 0 else None
    fix_sizes = _sizes_fix(cp, tp, hq_rank, hk_rank, gpn)

    if sizes is not None and (
        not isinstance(sizes, list) or not all(isinstance(x, int) and x >= 1 for x in sizes)
    ):
        raise ConfigError(f"{SIZES_KEY}={sizes!r}: expected a list of two integers [a2a, p2p]")
    if hcp and cp > 1 and not sizes:
        out.append(Finding(
            "error", "silent-cp-off",
            f"model.cp_comm_type=a2a+p2p with context_parallel_size={cp} but no {SIZES_KEY}: "
            "Megatron-Core hands TE an empty hierarchical group, TE computes cp_size=1 and "
            f"each rank attends only to its own 1/{cp} of the sequence, with no error. It "
            "looks fast (Bridge #2667: >2x the GPU's peak TFLOP/s) and trains a wrong model",
            fix_sizes,
        ))
    if sizes and len(sizes) != 2:
        out.append(Finding(
            "error", "two-levels",
            f"{SIZES_KEY}={sizes}: {len(sizes)} levels; Transformer Engine runs exactly two "
            "([a2a, p2p]: all-to-all inside, ring across)",
            fix_sizes,
        ))
    if sizes and math.prod(sizes) != cp:
        arith = " * ".join(f"{n}({v})" for n, v in zip(("a2a", "p2p", "l2", "l3"), sizes))
        out.append(Finding(
            "error", "sizes-product",
            f"{SIZES_KEY}={sizes}: {arith} = {math.prod(sizes)} != context_parallel_size({cp})",
            fix_sizes,
        ))
    if sizes and not hcp:
        out.append(Finding(
            "warning", "sizes-ignored",
            f"{SIZES_KEY}={sizes} is set but cp_comm_type={comm or 'p2p (default)'}: the sizes "
            "are used only by a2a+p2p, so they do nothing here",
            f"model.cp_comm_type=a2a+p2p to use them, or {SIZES_KEY}=null",
        ))
    if seq is not None and cp > 1 and seq % (2 * cp):
        lo = seq // (2 * cp) * (2 * cp)
        out.append(Finding(
            "error", "seq-divisible",
            f"model.seq_length={seq} is not divisible by 2*cp = {2 * cp} "
            "(load-balanced causal chunks)",
            f"model.seq_length={lo + 2 * cp}" + (f" (or {lo})" if lo else ""),
        ))
    if heads is not None and (heads % tp or kv % tp):
        out.append(Finding(
            "error", "heads-tp",
            f"tensor_model_parallel_size={tp} does not divide num_attention_heads={heads} "
            f"and num_query_groups={kv}",
            "model.tensor_model_parallel_size=" + str(max(d for d in range(1, kv + 1)
                                                         if heads % d == 0 and kv % d == 0
                                                         and d <= tp)),
        ))
    a2a = sizes[0] if hcp and sizes and len(sizes) == 2 else cp if "a2a" in types else None
    if heads is None and a2a and a2a > 1:
        out.append(Finding(
            "info", "heads-unknown",
            "head counts unknown, so head divisibility was not checked",
            "give model.num_attention_heads/num_query_groups, or model=NAME",
        ))
    elif a2a and a2a > 1 and hq_rank and hk_rank:
        for what, n, key in (("query heads", hq_rank, "num_attention_heads"),
                             ("KV heads", hk_rank, "num_query_groups")):
            if n % a2a:
                out.append(Finding(
                    "error", "heads-a2a",
                    f"a2a size {a2a} does not divide per-TP-rank {what}: {key}/tp = "
                    f"{n * tp}/{tp} = {n}; TE scatters heads over the a2a group and fails "
                    "with a shape error",
                    fix_sizes if hcp else "model.cp_comm_type=a2a+p2p " + fix_sizes,
                ))
    if (hcp or sizes) and _get(tree, "dist.use_decentralized_pg", False):
        out.append(Finding(
            "error", "decentralized-pg",
            "dist.use_decentralized_pg=true with hierarchical CP: Bridge raises "
            "NotImplementedError on the decentralized path when the sizes are set",
            "dist.use_decentralized_pg=false",
        ))
    uses_a2a = hcp or "a2a" in types
    te = te_version or installed_te_version()
    packed = _get(tree, "model.qkv_format") == "thd" or bool(
        _get(tree, "dataset.packed_sequence_specs.packed_sequence_size", 0)
    )
    if hcp and te is not None and version_tuple(te) < TE_MIN_HCP:
        out.append(Finding(
            "error", "te-version",
            f"Transformer Engine {te} < 1.12.0, the first release with the a2a+p2p path",
            "use a container with Transformer Engine >= 1.12.0",
        ))
    if hcp and packed and te is not None and version_tuple(te)[:2] <= TE_MAX_NO_THD:
        out.append(Finding(
            "error", "te-thd",
            f"packed sequences (THD) with a2a+p2p need Transformer Engine newer than 2.18; "
            f"found {te}",
            "use Transformer Engine >= 2.19, or model.cp_comm_type=p2p for packed data",
        ))
    if hcp and te is None:
        out.append(Finding(
            "info", "te-version",
            "Transformer Engine is not installed here, so its version was not checked",
            "pass te_version=X.Y.Z (the training container's TE) to check it",
        ))
    if uses_a2a and cp > 1:
        window = _get(tree, "model.window_size")
        softmax = _get(tree, "model.softmax_type", "vanilla")
        if window is not None:
            out.append(Finding(
                "error", "attention-features",
                f"model.window_size={window}: sliding-window attention is not supported "
                "with a2a/a2a+p2p context parallelism in Transformer Engine",
                "model.cp_comm_type=p2p, or model.window_size=null",
            ))
        if softmax != "vanilla":
            out.append(Finding(
                "error", "attention-features",
                f"model.softmax_type={softmax}: TE's a2a/a2a+p2p CP supports only the "
                "vanilla softmax",
                "model.cp_comm_type=p2p, or model.softmax_type=vanilla",
            ))
        if _get(tree, "model.position_embedding_type") == "relative":
            out.append(Finding(
                "error", "attention-features",
                "model.position_embedding_type=relative adds an attention bias, which TE's "
                "a2a/a2a+p2p CP does not support",
                "model.cp_comm_type=p2p",
            ))
    if cluster and a2a and a2a > 1 and tp * a2a > cluster.gpus_per_node:
        out.append(Finding(
            "warning", "a2a-cross-node",
            f"tp*a2a = {tp}*{a2a} = {tp * a2a} > {cluster.gpus_per_node} GPUs per node on "
            f"{cluster.name}: the all-to-all level runs over inter-node links",
            fix_sizes,
        ))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: order[f.severity])
