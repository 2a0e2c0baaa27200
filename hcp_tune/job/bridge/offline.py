"""Bridge recipes without the network: compute nodes often cannot reach Hugging Face.

Megatron-Bridge v0.6.0's recipes (e.g. ``recipes/llama/h100/llama3.py``) start with
``cfg.model = AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-8B")
.to_megatron_provider(load_weights=False)``: they need the model's Hugging Face *config*
(not its weights), downloaded unless it is in the node's cache. ``call_recipe`` runs the
recipe with the recipe module's ``AutoBridge`` name replaced, for that call only, by a
shim that:

1. asks the real ``AutoBridge.from_hf_pretrained`` with the hub offline
   (``HF_HUB_OFFLINE=1``, set by the job before Bridge is imported unless the user set it):
   a local path or a cached config works as before;
2. failing that, builds the config from the trial's model dimensions (``hf_config``: a
   ``transformers.LlamaConfig`` for Llama recipes) and hands it to Bridge's own
   ``AutoBridge.from_hf_config``, so the provider comes from Bridge's conversion code;
3. failing that (not a model hcp-tune can describe), raises ``RecipeNeedsFiles``: one line
   saying which config is missing and what to set.

The data is always Bridge's mock dataset and the tokenizer the NullTokenizer
(``config.dataset_fields``), so no tokenizer files are needed. What the recipe sets beyond
the model (its PP and virtual pipeline, recompute, comm overlap) is kept; the sweep's
layout fields are applied after it (``config.layout_fields``).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from hcp_tune.job.failures import EnvironmentProblem

# what a Llama recipe's Hugging Face config holds that the model profile does not
LLAMA3_ROPE_THETA = 500000.0


class RecipeNeedsFiles(EnvironmentProblem):
    """A recipe needs a Hugging Face config (or tokenizer) that is not on this node: an
    ``environment`` failure (the sweep stops and says how to resume)."""


def hf_config(path: str, spec) -> Optional[Any]:
    """A ``transformers`` config for ``path`` from the trial's dimensions, or None when
    hcp-tune cannot describe that model (only Llama-shaped models, from their profile)."""
    if "llama" not in str(path).lower():
        return None
    try:
        from transformers import LlamaConfig
    except ImportError:
        return None
    return LlamaConfig(
        hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab,
        max_position_embeddings=spec.seq, rope_theta=LLAMA3_ROPE_THETA,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def _offline_auto_bridge(real: Any, make_config: Callable[[str], Optional[Any]], name: str):
    class OfflineAutoBridge:
        """Stands in for ``AutoBridge`` inside one recipe call (see the module docstring)."""

        @staticmethod
        def from_hf_pretrained(path, **kwargs):
            try:
                return real.from_hf_pretrained(path, **kwargs)
            except Exception as err:  # offline and not cached: OSError, hub errors
                config = make_config(str(path))
                if config is None:
                    raise RecipeNeedsFiles(
                        f"runner.recipe={name}: needs the Hugging Face config of {path}, which "
                        f"is not on this node and cannot be downloaded ({type(err).__name__}); "
                        "put it in the node's Hugging Face cache (HF_HOME) or give a local "
                        "path, or drop runner.recipe to build the model from the model "
                        "profile") from None
                return real.from_hf_config(config)

        def __getattr__(self, item):  # anything else the recipe asks of AutoBridge
            return getattr(real, item)

    return OfflineAutoBridge


def call_recipe(fn: Callable[[], Any], *, name: str,
                make_config: Callable[[str], Optional[Any]]) -> Any:
    """``fn()`` with its module's ``AutoBridge`` made offline for the call (restored after)."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    real = getattr(module, "AutoBridge", None) if module is not None else None
    if real is None:
        return fn()
    setattr(module, "AutoBridge", _offline_auto_bridge(real, make_config, name))
    try:
        return fn()
    finally:
        setattr(module, "AutoBridge", real)
