"""Megatron-Bridge's pretraining recipes, as data: the parallel sizes each recipe sets,
keyed by (model profile, sequence length) for the long-context ones, and by function name.

What belongs here: the tables and the lookups that fill ``tp``/``pp`` when a user gives
neither (``tp=null pp=null`` in conf/config.yaml) or names a recipe (``runner.recipe``); a
size the user gives always wins. Read at Bridge v0.6.0, commit
``51885cf132b2814188b6855c25a8588254274c2a``, from ``src/megatron/bridge/recipes/llama/
h100/llama3.py`` (the functions; ``recipes/llama/llama3.py`` keeps the legacy names used
here as aliases). The long-context values are unchanged from the first reading at
``605c8167`` (before the recipes moved under ``h100/``). Every long-context recipe sets
``sequence_parallel=True``, ``micro_batch_size=1``, ``global_batch_size=512``,
``virtual_pipeline_model_parallel_size=None`` and ``recompute_granularity=None``; each
recipe also calls ``AutoBridge.from_hf_pretrained`` on the model's Hugging Face name, which
the job answers offline (``job/bridge/offline.py``). Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

BRIDGE_COMMIT = "51885cf132b2814188b6855c25a8588254274c2a"  # v0.6.0
RECIPE_FILE = "src/megatron/bridge/recipes/llama/h100/llama3.py"


@dataclass(frozen=True)
class Recipe:
    """The parallel sizes of one Bridge recipe function."""

    function: str
    tp: int
    pp: int
    cp: int
    gbs: int = 512
    mbs: int = 1
    vp: int | None = None  # virtual pipeline stages per rank (None: off)

    @property
    def cite(self) -> str:
        return f"Megatron-Bridge {RECIPE_FILE}:{self.function} @ {BRIDGE_COMMIT[:10]}"


# (model profile name, seq) -> recipe
RECIPES: dict[tuple[str, int], Recipe] = {
    ("llama3-8b", 16384): Recipe("llama3_8b_16k_pretrain_config", tp=4, pp=2, cp=2),
    ("llama3-8b", 65536): Recipe("llama3_8b_64k_pretrain_config", tp=4, pp=2, cp=4),
    ("llama3-8b", 131072): Recipe("llama3_8b_128k_pretrain_config", tp=4, pp=2, cp=8),
    ("llama3-70b", 16384): Recipe("llama3_70b_16k_pretrain_config", tp=8, pp=2, cp=2),
    ("llama3-70b", 65536): Recipe("llama3_70b_64k_pretrain_config", tp=8, pp=4, cp=8),
}


def recipe_for(model: str, seq: int) -> Recipe | None:
    """Bridge's recipe for this model profile at exactly this sequence length, or None."""
    return RECIPES.get((model, seq))


# runner.recipe=NAME -> its sizes: the long-context recipes above and the short-context
# pretraining recipes of the same file (seq 8192)
NAMED: dict[str, Recipe] = {r.function: r for r in RECIPES.values()} | {r.function: r for r in (
    Recipe("llama3_8b_pretrain_config", tp=1, pp=1, cp=2),
    Recipe("llama31_8b_pretrain_config", tp=1, pp=1, cp=2),
    Recipe("llama3_70b_pretrain_config", tp=4, pp=4, cp=2, vp=5),
    Recipe("llama31_70b_pretrain_config", tp=4, pp=4, cp=2, vp=5),
    Recipe("llama31_405b_pretrain_config", tp=8, pp=8, cp=4, vp=2),
)}


def recipe_named(name: str | None) -> Recipe | None:
    """The sizes of the recipe ``runner.recipe`` names (its last dotted component), or None."""
    if not name:
        return None
    return NAMED.get(name.replace(":", ".").rsplit(".", 1)[-1])
