"""Bridge recipes without the network: compute nodes often cannot reach Hugging Face.

Megatron-Bridge v0.6.0's recipes (e.g. ``recipes/llama/h100/llama3.py``) start with
``cfg.model = AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-8B")
.to_megatron_provider(load_weights=False)``: they need the model's Hugging Face *config*
(not its weights), downloaded unless it is in the node's cache. ``call_recipe`` runs the
recipe with the recipe module's ``AutoBridge`` name replaced, for that call only, by a
subclass of the real one (every other class attribute answers as before) whose
``from_hf_pretrained``:

1. builds the config from the trial's model dimensions when hcp-tune can describe the model
   (``hf_config``: a ``transformers.LlamaConfig`` for Llama recipes, with the RoPE base and
   scaling of the Llama generation the path names) and hands it to Bridge's own
   ``AutoBridge.from_hf_config``: every rank builds the same model, the one the plan
   predicted, with no hub access at all;
2. otherwise asks the real ``from_hf_pretrained`` with the hub offline (the job sets
   ``HF_HUB_OFFLINE=1`` before Bridge is imported, whatever the node had: N ranks racing a
   download is never wanted in a trial): a local path or a cached config works;
3. failing both, raises ``RecipeNeedsFiles``: one line saying which config is missing and
   what to set.

Which of the two answered is kept (``last_sources``) and noted with the trial.
The data is always Bridge's mock dataset and the tokenizer the NullTokenizer
(``config.dataset_fields``), so no tokenizer files are needed. What the recipe sets beyond
the model (its PP and virtual pipeline, recompute, comm overlap) is kept; the sweep's
layout fields are applied after it (``config.layout_fields``).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from hcp_tune.job.failures import EnvironmentProblem

# what a Llama recipe's Hugging Face config holds that the model profile does not, by the
# generation its path names (the meta-llama config.json files): the RoPE base, and from 3.1
# on the "llama3" RoPE scaling (Bridge's llama_bridge.py turns it into rope_scaling=True
# with its factor)
LLAMA2_ROPE_THETA = 10000.0
LLAMA3_ROPE_THETA = 500000.0
LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_ROPE_FACTOR = 32.0  # Llama 3.2 1B / 3B
_SOURCES: list[str] = []


def last_sources() -> list[str]:
    """Where the last ``call_recipe``'s model configs came from, one line each."""
    return list(_SOURCES)


class RecipeNeedsFiles(EnvironmentProblem):
    """A recipe needs a Hugging Face config (or tokenizer) that is not on this node: an
    ``environment`` failure (the sweep stops and says how to resume)."""


def llama_rope(path: str) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling) of the Llama generation ``path`` names."""
    low = str(path).lower().replace("_", "-")
    if "llama-2" in low or "llama2" in low:
        return LLAMA2_ROPE_THETA, None
    for tag, factor in (("3.2", LLAMA32_ROPE_FACTOR), ("3.1", 8.0), ("3.3", 8.0)):
        if f"llama-{tag}" in low or f"llama{tag}" in low:
            return LLAMA3_ROPE_THETA, {**LLAMA3_ROPE_SCALING, "factor": factor}
    return LLAMA3_ROPE_THETA, None  # Llama 3 (Meta-Llama-3-8B / 70B): no scaling


def hf_config(path: str, spec) -> Optional[Any]:
    """A ``transformers`` config for ``path`` from the trial's dimensions, or None when
    hcp-tune cannot describe that model (only Llama-shaped models, from their profile)."""
    if "llama" not in str(path).lower():
        return None
    try:
        from transformers import LlamaConfig
    except ImportError:
        return None
    theta, scaling = llama_rope(path)
    return LlamaConfig(
        hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab,
        max_position_embeddings=spec.seq, rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def offline_auto_bridge(real: Any, make_config: Callable[[str], Optional[Any]], name: str):
    """The stand-in for ``AutoBridge`` inside one recipe call (see the module docstring):
    a subclass of ``real``, so ``from_hf_config`` and anything else the recipe asks of the
    class answer as before."""

    def from_hf_pretrained(cls, path, **kwargs):
        config = make_config(str(path))
        if config is not None:
            _SOURCES.append(f"{path}: built from the model profile's dimensions")
            return real.from_hf_config(config)
        try:
            out = real.from_hf_pretrained(path, **kwargs)
        except Exception as err:  # offline and not cached: OSError, hub errors
            raise RecipeNeedsFiles(
                f"runner.recipe={name}: needs the Hugging Face config of {path}, which "
                f"is not on this node and cannot be downloaded ({type(err).__name__}); "
                "put it in the node's Hugging Face cache (HF_HOME) or give a local "
                "path, or drop runner.recipe to build the model from the model "
                "profile") from None
        _SOURCES.append(f"{path}: the node's cached Hugging Face config")
        return out

    return type("OfflineAutoBridge", (real,), {
        "from_hf_pretrained": classmethod(from_hf_pretrained),
        "__doc__": "AutoBridge for one recipe call: offline (hcp_tune.job.bridge.offline)"})


def call_recipe(fn: Callable[[], Any], *, name: str,
                make_config: Callable[[str], Optional[Any]]) -> Any:
    """``fn()`` with its module's ``AutoBridge`` made offline for the call (restored after)."""
    _SOURCES.clear()
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    real = getattr(module, "AutoBridge", None) if module is not None else None
    if real is None:
        return fn()
    setattr(module, "AutoBridge", offline_auto_bridge(real, make_config, name))
    try:
        return fn()
    finally:
        setattr(module, "AutoBridge", real)
