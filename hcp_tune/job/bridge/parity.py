"""What Bridge's recipes run that a config built from scratch would not: their process
environment, their fusions, their garbage collection, their data-loader workers (the values, pinned to Megatron-Bridge
v0.6.0), and what this trial applied of them (``recipe_parity``, recorded in its fingerprint;
``prestart`` exports the environment before CUDA starts). Standard library only: ``config.bridge_fields`` reads the values as data.
"""
from __future__ import annotations

from typing import Any

# the pinned Megatron-Bridge (config.py re-exports both)
BRIDGE_VERSION = "v0.6.0"
BRIDGE_COMMIT = "51885cf132b2814188b6855c25a8588254274c2a"

# What Bridge's Llama recipes run and a scratch config would not, read from BRIDGE_COMMIT:
# - the process environment of every hardware recipe (recipes/utils/environment_utils.py,
#   COMMON_RECIPE_ENV_VARS, spread into ``cfg.env_vars`` by recipes/llama/h100/llama3.py);
#   Bridge applies ``env_vars`` with ``os.environ.setdefault`` (training/config.py,
#   apply_environment_variables), so a value the launcher or user set wins;
# - the fusions the Llama conversion sets on its provider (models/llama/llama_bridge.py,
#   provider_bridge) and the recipes' loss fusion (recipes/llama/h100/llama3.py);
# - the recipes' data-loader workers (``cfg.dataset.num_workers = 8``).
RECIPE_ENV_VARS: dict[str, Any] = {
    "NCCL_GRAPH_REGISTER": 0,
    "NCCL_NVLS_ENABLE": 0,
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": 1,
    "TORCH_NCCL_HIGH_PRIORITY": 1,
}
LLAMA_FUSIONS: dict[str, Any] = {
    "model.bias_activation_fusion": True,
    "model.masked_softmax_fusion": True,
    "model.persist_layer_norm": True,
    "model.bias_dropout_fusion": True,
    "model.apply_rope_fusion": True,
    "model.cross_entropy_loss_fusion": True,
    "model.cross_entropy_fusion_impl": "te",
}
RECIPE_NUM_WORKERS = 8
# the Llama recipes' garbage collection (recipes/llama/h100/llama3.py, every config:
# ``cfg.train.manual_gc = True``, ``manual_gc_interval = 100``): Bridge's train loop then
# calls ``gc.disable()`` before the first step and collects only every 100th iteration
# (training/train.py, ``maybe_run_manual_gc``), so no collection lands inside a short
# trial's timed steps; with Python's automatic GC one may, on one rank, and stall the rest
RECIPE_GC: dict[str, Any] = {"train.manual_gc": True, "train.manual_gc_interval": 100}
# what a Llama recipe takes from the model's Hugging Face config and scratch mode cannot
# know from a model profile (dimensions only); none of it changes a step's work
SCRATCH_NOT_APPLIED = (
    "model.rotary_base (Llama 3: 500000 from the Hugging Face config; Megatron's default here)",
    "model.rope_scaling (Llama 3.1+: the llama3 RoPE scaling of the Hugging Face config)",
)


def recipe_parity(fields: dict[str, Any]) -> dict[str, Any]:
    """What of the Llama recipes' environment and fusions this trial runs with, recorded in
    the trial's fingerprint: recipe mode takes them from the recipe itself; scratch mode
    applies ``RECIPE_ENV_VARS`` and ``LLAMA_FUSIONS`` unless an override replaced one
    (listed under ``not_applied`` with ``SCRATCH_NOT_APPLIED``)."""
    if "recipe" in fields:
        return {"mode": "recipe", "source": f"{fields['recipe']} (its own env_vars and fusions)"}
    env = fields.get("env_vars") or {}
    not_applied = [f"env_vars.{k}" for k, v in RECIPE_ENV_VARS.items() if env.get(k) != v]
    not_applied += [k for k, v in LLAMA_FUSIONS.items() if fields.get(k) != v]
    not_applied += [k for k, v in RECIPE_GC.items() if fields.get(k) != v]
    if fields.get("dataset.num_workers") != RECIPE_NUM_WORKERS:
        not_applied.append("dataset.num_workers")
    return {"mode": "scratch", "source": f"Megatron-Bridge {BRIDGE_VERSION} Llama recipes",
            "env_vars": {k: env[k] for k in RECIPE_ENV_VARS if k in env},
            "fusions": sorted(k for k in LLAMA_FUSIONS if fields.get(k) == LLAMA_FUSIONS[k]),
            "gc": {k: fields.get(k) for k in RECIPE_GC},
            "not_applied": not_applied + list(SCRATCH_NOT_APPLIED)}
