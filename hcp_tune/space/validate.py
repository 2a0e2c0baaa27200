"""``validate``: read a user's Bridge config, then run every HCP rule (``rules.py``) on it.

Input is a Bridge config YAML and/or Bridge-style overrides (``model.cp_comm_type=a2a+p2p``):

- a hand-written run config: sections ``model``, ``dist``, ``dataset``, ``ddp`` ...;
- the resolved config Bridge's ``scripts/training/run_recipe.py --dry-run`` prints (and saves
  as ``ConfigContainer.yaml``) through ``ConfigContainer.print_yaml``: the same sections, each
  with a ``_target_`` naming its class, the top level ``_target_`` ending in
  ``ConfigContainer``. The runner's own fix-ups (the dataset's ``seq_length`` copied into the
  model, the finetuning loss settings) have already run, so its values are the ones that
  run. A ``GPTModelConfig`` model keeps the transformer fields under ``model.transformer``.

Packed sequences are read from the dataset section (``is_packed``, ``pad_multiple``; field
names from Megatron-Bridge r0.6.0, see ``upstream/te_packed.py``); whether the forward step
passes ``pad_between_seqs`` to TE is not in any Bridge config, so it is validate's own key.

This module only parses: it turns the tree into ``rules.Facts`` (a wrong type is a
``ConfigError``, exit 2) and the rules decide. No torch: Transformer Engine's version is
read from package metadata.
"""
from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path
from typing import Any, Optional

import yaml

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.config.schema import as_bool, as_int
from hcp_tune.errors import ConfigError, InputFileError
from hcp_tune.upstream.rules import Facts, Finding, evaluate, suggest_sizes, version_tuple
from hcp_tune.upstream.te_packed import PAD_KEY

__all__ = ["Finding", "apply_overrides", "check", "facts", "read_config_file", "suggest_sizes"]

BRIDGE_SECTIONS = (
    "model", "dist", "train", "dataset", "logger", "tokenizer", "checkpoint", "optimizer",
    "scheduler", "ddp", "mixed_precision", "rng", "profiling", "comm_overlap",
)
# Bridge's finetuning dataset classes (ConfigContainer.validate checks these for CP > 1)
FINETUNING_DATASETS = ("GPTSFTDatasetConfig", "FinetuningDatasetConfig",
                       "DirectHFSFTDatasetConfig", "EnergonDatasetConfig", "MockVLMSFTDatasetConfig")


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
    """``tree[a][b]...``; a model field is also looked up under ``model.transformer``."""
    for path in (dotted, dotted.replace("model.", "model.transformer.", 1)):
        node: Any = tree
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return default


def _int(tree: dict[str, Any], key: str, default: Optional[int],
         minimum: int = 1) -> Optional[int]:
    value = _get(tree, key, default)
    return None if value is None else as_int(value, key, strict=True, minimum=minimum)


def _bool(tree: dict[str, Any], key: str, default: bool) -> bool:
    return as_bool(_get(tree, key, default), key)


def _flag(value: Any, key: str) -> Optional[bool]:
    """A command-line ``key=true|false`` (YAML, as the overrides), or None when not given."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            pass
    return None if value is None else as_bool(value, key)


def _int_list(tree: dict[str, Any], key: str, length: Optional[int] = None,
              minimum: int = 1) -> Optional[tuple[int, ...]]:
    value = _get(tree, key)
    if value is None:
        return None
    ok = isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in value)
    if not ok or (length is not None and len(value) != length):
        what = f"a list of {length} integers" if length else "a list of integers >= 1"
        raise ConfigError(f"{key}={value!r}: expected {what}")
    return tuple(value)


def _class_name(node: Any) -> str:
    target = node.get("_target_") if isinstance(node, dict) else None
    return str(target).rsplit(".", 1)[-1] if target else ""


def is_resolved(tree: dict[str, Any]) -> bool:
    """The tree is run_recipe.py's ``--dry-run`` output (``ConfigContainer.print_yaml``)."""
    return _class_name(tree).endswith("ConfigContainer")


def is_finetuning(tree: dict[str, Any]) -> bool:
    """A finetuning dataset: one of Bridge's SFT dataset classes, or a dataset with the
    packing switches run_recipe.py looks for."""
    dataset = tree.get("dataset")
    if not isinstance(dataset, dict):
        return False
    return _class_name(dataset) in FINETUNING_DATASETS or bool(
        {"enable_offline_packing", "enable_in_batch_packing"} & set(dataset))


def installed_te_version() -> Optional[str]:
    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _comm_types(tree: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    comm = _get(tree, "model.cp_comm_type")
    if isinstance(comm, list):
        if not comm or not all(isinstance(t, str) for t in comm):
            raise ConfigError(f"model.cp_comm_type={comm!r}: expected a string or a list of "
                              "strings (one per layer)")
        return tuple(comm), True
    if comm is not None and not isinstance(comm, str):
        raise ConfigError(f"model.cp_comm_type={comm!r}: expected p2p, a2a, all_gather, "
                          "a2a+p2p, or a list of them (one per layer)")
    return (comm or "p2p",), False  # Megatron-Core hands TE "p2p" when unset


def _specs(tree: dict[str, Any]) -> tuple[str, Any]:
    """Offline packing's ``PackedSequenceSpecs`` and where: ``dataset.offline_packing_specs``
    (Bridge 0.6, ``data/builders/gpt_sft.py`` GPTSFTDatasetConfig) or
    ``dataset.packed_sequence_specs`` (Bridge <= 0.5, ``data/datasets/packed_sequence.py``)."""
    for key in ("dataset.offline_packing_specs", "dataset.packed_sequence_specs"):
        node = _get(tree, key)
        if node is not None:
            return key, node
    return "", None


def is_packed(tree: dict[str, Any]) -> bool:
    """Documents are packed (THD reaches TE: Bridge's ``get_packed_seq_params`` sets
    ``qkv_format="thd"``): offline or in-batch packing switched on, or packing specs with a
    ``packed_sequence_size`` > 0 (-1 means no packing). ``model.qkv_format=thd`` is hcp-tune's
    shorthand (not a Bridge field)."""
    if _get(tree, "model.qkv_format") == "thd" or any(
            _bool(tree, f"dataset.{k}", False)
            for k in ("enable_offline_packing", "enable_in_batch_packing")):
        return True
    key, specs = _specs(tree)
    size = (_int(tree, f"{key}.packed_sequence_size", None, minimum=-1)
            if isinstance(specs, dict) else None)
    return size is not None and size > 0


def pad_multiple(tree: dict[str, Any], cp: int, tp: int, resolved: bool) -> int:
    """The multiple each packed document is padded to, as Bridge 0.6 runs it: the multiple
    of 2*cp (and cp*tp with sequence parallelism) that ``ConfigContainer.validate`` sets as
    ``in_batch_packing_pad_to_multiple_of``, or offline packing's ``pad_seq_to_mult`` raised
    to it by ``recipe_runner.py`` ``sync_offline_packing_alignment`` (a resolved config
    shows the raised value)."""
    sp = _bool(tree, "model.sequence_parallel", False) and tp > 1
    unit = math.lcm(2 * cp if cp > 1 else 1, cp * tp if sp else 1)
    key, specs = _specs(tree)
    if _bool(tree, "dataset.enable_in_batch_packing", False) or not isinstance(specs, dict):
        return unit
    given = _int(tree, f"{key}.pad_seq_to_mult", None) or 1
    return given if resolved else math.lcm(given, unit)


def facts(tree: dict[str, Any], *, model: Optional[ModelSpec] = None,
          cluster: Optional[ClusterProfile] = None, te_version: Optional[str] = None,
          pad_between_seqs: Optional[Any] = None) -> Facts:
    """What the rules read, from a Bridge config tree (``model=`` fills missing dimensions;
    ``pad_between_seqs``: what the user's forward step passes to TE, None when it leaves it
    to TE, as Bridge 0.6 does)."""
    resolved = is_resolved(tree)
    comm_types, per_layer = _comm_types(tree)
    model_seq = _int(tree, "model.seq_length", None)
    dataset_seq = _int(tree, "dataset.seq_length", None)
    # a hand-written config goes through run_recipe.py, which runs the dataset's length
    use_dataset = dataset_seq is not None and (not resolved or model_seq is None)
    te = te_version or installed_te_version()
    cp = _int(tree, "model.context_parallel_size", 1)
    tp = _int(tree, "model.tensor_model_parallel_size", 1)
    packed = is_packed(tree)
    softmax = _get(tree, "model.softmax_type", "vanilla")
    return Facts(
        cp=cp, tp=tp,
        seq=dataset_seq if use_dataset else model_seq,
        seq_key="dataset.seq_length" if use_dataset else "model.seq_length",
        heads=_int(tree, "model.num_attention_heads", model.heads if model else None),
        kv_heads=_int(tree, "model.num_query_groups", model.kv_heads if model else None),
        comm_types=comm_types, per_layer=per_layer,
        sizes=_int_list(tree, "model.hierarchical_context_parallel_sizes"),
        num_layers=_int(tree, "model.num_layers", model.layers if model else None),
        gpus_per_node=cluster.gpus_per_node if cluster else None,
        te_version=version_tuple(te) if te else None,
        packed=packed,
        pad_between_seqs=_flag(pad_between_seqs, PAD_KEY),
        pad_multiple=pad_multiple(tree, cp, tp, resolved) if packed else None,
        window_size=_int_list(tree, "model.window_size", length=2, minimum=-1),
        softmax_type=str(softmax),
        position_embedding_type=_get(tree, "model.position_embedding_type"),
        decentralized_pg=_bool(tree, "dist.use_decentralized_pg", False),
        model_seq=model_seq, dataset_seq=dataset_seq, resolved=resolved,
        finetuning=is_finetuning(tree),
        per_token_loss=_bool(tree, "model.calculate_per_token_loss", False),
        average_in_collective=_bool(tree, "ddp.average_in_collective", False),
        pp=_int(tree, "model.pipeline_model_parallel_size", 1) or 1,
        pp_plain=not any(_get(tree, f"model.{k}") for k in (
            "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
            "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
            "pipeline_model_parallel_layout")),
    )


def check(
    tree: dict[str, Any],
    *,
    model: Optional[ModelSpec] = None,
    cluster: Optional[ClusterProfile] = None,
    te_version: Optional[str] = None,
    pad_between_seqs: Optional[Any] = None,
) -> list[Finding]:
    """Every HCP rule over a Bridge config tree: parse, then run the rules (errors first)."""
    return evaluate(facts(tree, model=model, cluster=cluster, te_version=te_version,
                          pad_between_seqs=pad_between_seqs))
