"""A Bridge trial's configuration: the TrialSpec as a mapping of ConfigContainer field paths.

What belongs here: ``bridge_fields(spec)``, a pure function from a ``TrialSpec`` to an
ordered mapping ``{"model.context_parallel_size": 4, ...}`` (user overrides last), the
parsing of Bridge's ``KEY=VALUE`` overrides, and ``build_container(fields)``, which turns
that mapping into Megatron-Bridge's real ``ConfigContainer`` inside the job (the only
function here that imports ``megatron.bridge``, lazily). Standard library only at import,
so the orchestrator can check overrides and tests can read the mapping as data.

Pinned against Megatron-Bridge v0.6.0 (commit 51885cf132b2814188b6855c25a8588254274c2a)
and the Megatron-LM it ships (3rdparty/Megatron-LM at cd4afffa648426a9): the classes in
``SECTIONS``, ``pretrain``'s ``callbacks=`` argument, the ``mixed_precision`` recipe names
(``training/mixed_precision.py``) and the mock-dataset keyword arguments Bridge's own
``tests/functional_tests/test_groups/training/test_pretrain.py`` passes. Every field path
set here is checked against the field names read from those sources
(``tests/data/bridge_fields.json``, written by ``scripts/bridge_fields.py``).

No model download: scratch mode builds a ``GPTModelProvider`` with the model spec's
dimensions; ``recipe`` mode starts from a named Bridge recipe function, its Hugging Face
config read offline (``offline.py``), and sets only the layout, run-length and dataset
fields on it.
"""
from __future__ import annotations

import ast
import importlib
import math
from dataclasses import dataclass, field
from typing import Any

from hcp_tune.job.bridge.parity import (  # noqa: F401 (the pin, re-exported)
    BRIDGE_COMMIT,
    BRIDGE_VERSION,
    LLAMA_FUSIONS,
    RECIPE_ENV_VARS,
    RECIPE_GC,
    RECIPE_NUM_WORKERS,
)

# ConfigContainer's sections (its dataclass fields at BRIDGE_COMMIT, config.py), the only
# first components an override may name
CONTAINER_FIELDS = frozenset({
    "env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer",
    "optimizer_config_override_provider", "ddp", "validation", "scheduler", "dataset",
    "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler", "nvrx_straggler",
    "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect",
    "inprocess_restart",
})
# scratch mode: the Bridge class built for each section ("module:attr"); Bridge's
# training/config.py re-exports ValidationConfig and RNGConfig from megatron.training
_CFG = "megatron.bridge.training.config"
SECTIONS = {
    "model": "megatron.bridge.models.gpt_provider:GPTModelProvider",
    "train": f"{_CFG}:TrainingConfig",
    "validation": f"{_CFG}:ValidationConfig",
    "optimizer": f"{_CFG}:OptimizerConfig",
    "scheduler": f"{_CFG}:SchedulerConfig",
    "dataset": f"{_CFG}:MockGPTDatasetConfig",
    "logger": f"{_CFG}:LoggerConfig",
    "tokenizer": f"{_CFG}:TokenizerConfig",
    "checkpoint": f"{_CFG}:CheckpointConfig",
    "dist": f"{_CFG}:DistributedInitConfig",
    "rng": f"{_CFG}:RNGConfig",
    "ddp": f"{_CFG}:DistributedDataParallelConfig",
}
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}


class BridgeConfigError(ValueError):
    """A Bridge override or spec that cannot become a ConfigContainer."""


@dataclass(frozen=True)
class Ref:
    """A Python object named by import path (``"torch.nn.functional:silu"``), resolved
    only in the job: the mapping stays plain data."""

    path: str


@dataclass(frozen=True)
class Construct:
    """A Bridge object to build in the job: ``cls`` by import path, with ``kwargs``."""

    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- overrides

def parse_value(text: str) -> Any:
    """A KEY=VALUE value as Bridge's command line reads it: numbers, true/false, null,
    lists (``[2,2]``), quoted or bare strings."""
    text = text.strip()
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if text.startswith("[") and text.endswith("]"):  # a list of bare words: [a2a, p2p]
            return [parse_value(x) for x in text[1:-1].split(",") if x.strip()]
        return text


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """``["model.cp_comm_type=a2a+p2p", ...]`` -> ``[(path, value), ...]``; every bad entry
    is reported in one error."""
    out, problems = [], []
    for item in overrides:
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"{item!r}: expected KEY=VALUE, e.g. model.recompute_granularity=full")
            continue
        head = key.split(".")[0]
        if head not in CONTAINER_FIELDS:
            sections = ", ".join(sorted(CONTAINER_FIELDS))
            problems.append(f"{item!r}: {head!r} is not a ConfigContainer section "
                            f"(Megatron-Bridge {BRIDGE_VERSION}: {sections})")
            continue
        out.append((key, parse_value(value)))
    if problems:
        raise BridgeConfigError("runner.overrides: " + "; ".join(problems))
    return out


# ---------------------------------------------------------------- the mapping

def layout_fields(spec) -> dict[str, Any]:
    """The fields that make the trial's layout: TP, CP and how CP communicates."""
    comm = spec.comm_type
    fields: dict[str, Any] = {
        "model.tensor_model_parallel_size": spec.tp,
        # the sweep's pp always wins (the world tp*cp*dp*pp and the planned groups are built
        # from it); a recipe's virtual pipeline stays unless the sweep sets one
        "model.pipeline_model_parallel_size": spec.pp,
        "model.sequence_parallel": spec.tp > 1,  # what TP training runs with
        "model.context_parallel_size": spec.cp,
    }
    if spec.vp is not None or not spec.bridge_recipe:
        fields["model.virtual_pipeline_model_parallel_size"] = spec.vp
    if comm != "none":
        fields["model.cp_comm_type"] = comm
    # the a2a / p2p baselines run without HCP sizes; a2a+p2p must have them (Bridge asserts)
    fields["model.hierarchical_context_parallel_sizes"] = (
        [spec.a2a, spec.p2p] if comm == "a2a+p2p" else None)
    fields["model.seq_length"] = spec.seq
    return fields


COMM_TIMEOUT_FLOOR_MIN = 5  # the first iteration of a large world: communicators, warm-up
COMM_TIMEOUT_PER_GPUS = 64  # one minute more per this many GPUs


def distributed_timeout_minutes(spec) -> int:
    """Bridge's process-group timeout until its first iteration ends
    (``dist.distributed_timeout_minutes``): the first iteration creates every communicator
    and compiles kernels, slower the larger the world, so at least 5 minutes plus one per 64
    GPUs, never below ``comm_timeout_s`` and never beyond the trial's ``time_limit_s``."""
    first = COMM_TIMEOUT_FLOOR_MIN + spec.world_size // COMM_TIMEOUT_PER_GPUS
    minutes = max(math.ceil(spec.comm_timeout_s / 60), first)
    return max(1, min(minutes, math.ceil(spec.time_limit_s / 60)))


def timeout_after_init_s(spec) -> int:
    """``dist.distributed_timeout_seconds_after_init``: after step 1 Bridge v0.6.0
    (``training/train.py``, the ``step == start_iteration + 1`` branch) sets every group's
    timeout to it. A collective can wait on a peer for most of a step (the loop's barrier,
    the pipeline's first receive, the data-parallel reduce at the step's end), and one step
    at m = 3*pp micro-batches and 128K tokens can take minutes, so it stays the first
    iteration's timeout (``distributed_timeout_minutes``), never the attention runner's
    ``comm_timeout_s``: a hung peer is still bounded by it and by ``time_limit_s``."""
    return max(int(spec.comm_timeout_s), distributed_timeout_minutes(spec) * 60)


def run_fields(spec) -> dict[str, Any]:
    """A short measured run: warm-up + measured steps, ``spec.micro_batches`` micro-batches
    of ``mbs`` per data-parallel rank (the global batch mbs*dp*m), no checkpoint, no
    evaluation, a log line every step (the log-parsing fallback)."""
    iters = spec.warmup_steps + spec.measure_steps
    return {
        "train.train_iters": iters,
        "train.micro_batch_size": spec.mbs,
        "train.global_batch_size": spec.global_batch,
        "validation.eval_iters": 0,
        "checkpoint.save": None,
        "checkpoint.load": None,
        "logger.log_interval": 1,
        "logger.log_throughput": True,
        "dist.use_decentralized_pg": False,  # True with HCP sizes raises NotImplementedError
        "dist.distributed_timeout_minutes": distributed_timeout_minutes(spec),
        "dist.distributed_timeout_seconds_after_init": timeout_after_init_s(spec),
        "rng.seed": spec.seed,
        "scheduler.lr_warmup_iters": 1 if iters > 1 else 0,
        "scheduler.lr_decay_iters": iters,
        "mixed_precision": MIXED_PRECISION[spec.dtype],
    }


def dataset_fields(spec) -> dict[str, Any]:
    """Bridge's mock GPT data at the trial's sequence length and the null tokenizer.

    ``create_attention_mask`` is off: Megatron-Core's ``GPTDatasetConfig`` defaults it to
    True, and then every sample carries ``torch.tril(torch.ones(S, S))`` built on the host
    (``datasets/gpt_dataset.py``), collated per micro-batch into pinned memory by Bridge's
    loader and dropped by its ``gpt_step`` (TE builds the causal mask itself): 64 MiB a
    sample at 8K, 16 GiB (and 128 GiB of float temporaries while it is built:
    benchmarks/RESULTS-bridge-mask.md) at 128K, per rank. Bridge's own
    perf recipe turns it off (``perf_recipes/gpt_oss/common.py``). ``num_workers`` is the
    Llama recipes' (``RECIPE_NUM_WORKERS``)."""
    return {
        "dataset.seq_length": spec.seq,
        "dataset.random_seed": spec.seed,
        "dataset.create_attention_mask": False,
        "dataset.reset_attention_mask": False,
        "dataset.reset_position_ids": False,
        "dataset.eod_mask_loss": False,
        "dataset.num_dataset_builder_threads": 1,
        "dataset.data_sharding": True,
        "dataset.dataloader_type": "single",
        "dataset.num_workers": RECIPE_NUM_WORKERS,
        "tokenizer.tokenizer_type": "NullTokenizer",
        "tokenizer.vocab_size": spec.vocab,
    }


def model_fields(spec) -> dict[str, Any]:
    """A Llama-shaped GPT with the model spec's dimensions (RMSNorm, SwiGLU, RoPE, no
    biases, untied embeddings), dropout off so steps are comparable, with what a Llama
    recipe runs: its fusions (``LLAMA_FUSIONS``), its garbage collection (``RECIPE_GC``)
    and process environment (``RECIPE_ENV_VARS``, as the container's ``env_vars``). ``SCRATCH_NOT_APPLIED`` lists
    what it cannot know."""
    missing = [n for n in ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim",
                           "vocab") if not getattr(spec, n)]
    if missing:
        raise BridgeConfigError(
            f"runner=bridge needs the model's {', '.join(missing)}: give them in the model "
            "profile (conf/model/NAME.yaml), or start from a recipe with runner.recipe=NAME")
    return {
        "model.num_layers": spec.layers,
        "model.hidden_size": spec.hidden,
        "model.ffn_hidden_size": spec.ffn_hidden,
        "model.num_attention_heads": spec.heads,
        "model.num_query_groups": spec.kv_heads,
        "model.kv_channels": spec.head_dim,
        "model.vocab_size": None,  # Bridge takes the tokenizer's and pads it
        "model.make_vocab_size_divisible_by": 128,
        "model.normalization": "RMSNorm",
        "model.activation_func": Ref("torch.nn.functional:silu"),
        "model.gated_linear_unit": True,
        "model.position_embedding_type": "rope",
        "model.add_bias_linear": False,
        "model.attention_dropout": 0.0,
        "model.hidden_dropout": 0.0,
        "model.share_embeddings_and_output_weights": False,
        "optimizer.optimizer": "adam",
        "optimizer.lr": 3e-4,
        "optimizer.min_lr": 3e-5,
        "optimizer.weight_decay": 0.01,
        "optimizer.clip_grad": 1.0,
        "optimizer.use_distributed_optimizer": True,
        "ddp.use_distributed_optimizer": True,
        "ddp.grad_reduce_in_fp32": True,
        "ddp.overlap_grad_reduce": True,
        "ddp.overlap_param_gather": True,
        "scheduler.lr_decay_style": "cosine",
        "scheduler.weight_decay_incr_style": "constant",
        "scheduler.start_weight_decay": 0.01,
        "scheduler.end_weight_decay": 0.01,
        **LLAMA_FUSIONS,
        **RECIPE_GC,  # automatic GC off during the timed steps, as the recipes run
        "env_vars": dict(RECIPE_ENV_VARS),
    }


def bridge_fields(spec) -> dict[str, Any]:
    """The whole trial as ``{field path: value}``, in the order they are applied.

    Scratch mode (no ``spec.bridge_recipe``): model, optimizer, data, run and layout
    fields. Recipe mode: ``"recipe"`` names the function, ``"dataset"`` is replaced by the
    mock dataset, then the run and layout fields are set on the recipe's container. Packed
    sequences (``spec.packing == "thd"``): ``"dataset"`` is the provider of the trial's
    packed documents (``packed_data``) in either mode. The
    user's overrides come last; one that names a path already set replaces it and moves to
    the end, so what is applied last is what the user wrote.
    """
    fields: dict[str, Any] = {}
    if spec.bridge_recipe:
        fields["recipe"] = spec.bridge_recipe
        data = dataset_fields(spec)
        kwargs = {k.split(".", 1)[1]: v for k, v in data.items() if k.startswith("dataset.")}
        fields["dataset"] = Construct(SECTIONS["dataset"], kwargs)
        fields.update({k: v for k, v in data.items() if not k.startswith("dataset.")})
    else:
        fields.update(model_fields(spec))
        fields.update(dataset_fields(spec))
    if getattr(spec, "packing", "off") == "thd":  # packed documents instead of the mock data
        fields = {k: v for k, v in fields.items() if not k.startswith("dataset")}
        fields["dataset"] = packed_dataset(spec)
    fields.update(run_fields(spec))
    fields.update(layout_fields(spec))
    for key, value in parse_overrides(list(spec.bridge_overrides)):
        fields.pop(key, None)
        fields[key] = value
    return fields


def packed_dataset(spec) -> Construct:
    """``dataset`` of a packed trial: the provider of its documents (``packed_data``), with
    Bridge's ``PackedSequenceSpecs`` built in the job."""
    from hcp_tune.job.bridge.packed_data import (
        PACKED_SPECS,
        PROVIDER,
        PackedDataError,
        provider_kwargs,
    )

    try:
        kwargs = provider_kwargs(spec)
    except PackedDataError as e:
        raise BridgeConfigError(str(e)) from None
    kwargs["offline_packing_specs"] = Construct(PACKED_SPECS, kwargs["offline_packing_specs"])
    return Construct(PROVIDER, kwargs)


# ---------------------------------------------------------------- in the job

def resolve(path: str) -> Any:
    """``"pkg.module:attr"`` (or ``"pkg.module.attr"``) -> the object."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _materialize(value: Any) -> Any:
    if isinstance(value, Ref):
        return resolve(value.path)
    if isinstance(value, Construct):
        return resolve(value.cls)(**{k: _materialize(v) for k, v in value.kwargs.items()})
    return value


def apply_fields(root: Any, fields: dict[str, Any]) -> Any:
    """Set each ``a.b.c`` path on ``root`` in order; a path whose parent has no such
    attribute is an error naming it (a typo must not become a silently ignored field)."""
    for path, value in fields.items():
        if path == "recipe":
            continue
        *parents, last = path.split(".")
        obj = root
        for i, name in enumerate(parents):
            if not hasattr(obj, name):
                raise BridgeConfigError(f"{path}: {'.'.join(parents[:i + 1])} does not exist "
                                        f"in this Bridge's ConfigContainer")
            obj = getattr(obj, name)
        if obj is None or not hasattr(obj, last):
            raise BridgeConfigError(f"{path}: no field {last!r} on {type(obj).__name__} "
                                    f"in this Bridge's ConfigContainer")
        setattr(obj, last, _materialize(value))
    return root


def build_container(fields: dict[str, Any], spec: Any = None) -> Any:
    """The real ``ConfigContainer`` for ``fields`` (job side; imports megatron.bridge).

    Scratch mode builds each section from its own fields (constructors need some of them,
    e.g. the dataset's ``seq_length``), then applies every path, so a later path (an
    override) wins over a constructor argument.
    """
    if "recipe" in fields:
        name = fields["recipe"]
        fn = resolve(name) if "." in name or ":" in name else getattr(
            importlib.import_module("megatron.bridge.recipes"), name, None)
        if fn is None:
            raise BridgeConfigError(f"runner.recipe={name!r}: no such recipe function in "
                                    "megatron.bridge.recipes")
        from hcp_tune.job.bridge.offline import call_recipe, hf_config

        # no download: the recipe's Hugging Face config from the node's cache, else from
        # the trial's dimensions through Bridge's own AutoBridge.from_hf_config (offline.py)
        recipe = call_recipe(fn, name=name, make_config=lambda path: (
            hf_config(path, spec) if spec is not None else None))
        return apply_fields(recipe, fields)
    container_cls = resolve(f"{_CFG}:ConfigContainer")
    sections: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for path, value in fields.items():
        head, _, rest = path.partition(".")
        if head in SECTIONS and rest and "." not in rest:
            sections.setdefault(head, {})[rest] = _materialize(value)
        elif not rest:
            top[head] = _materialize(value)
    built = {name: resolve(cls)(**sections.get(name, {})) for name, cls in SECTIONS.items()
             if name not in top}  # a whole section given (the packed dataset) is not built
    return apply_fields(container_cls(**built, **top), {
        k: v for k, v in fields.items() if "." in k})


def summary(fields: dict[str, Any]) -> dict[str, Any]:
    """The mapping as JSON-able data, recorded with the trial's result."""
    def plain(v: Any) -> Any:
        if isinstance(v, Ref):
            return f"<{v.path}>"
        if isinstance(v, Construct):
            return {"_target_": v.cls, **{k: plain(x) for k, x in v.kwargs.items()}}
        return v
    return {k: plain(v) for k, v in fields.items()}


def container_paths(fields: dict[str, Any]) -> list[str]:
    """Every ConfigContainer path the mapping sets (``recipe`` is not one)."""
    return [k for k in fields if k != "recipe"]
