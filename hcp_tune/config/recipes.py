"""Megatron-Bridge's long-context pretraining recipes, as data: the parallel sizes each
recipe sets, keyed by (model profile, sequence length).

What belongs here: the table and the one lookup that fills ``tp``/``pp`` when a user gives
neither (``tp=null pp=null`` in conf/config.yaml); a size the user gives always wins. The
values were read from ``src/megatron/bridge/recipes/llama/llama3.py`` of
NVIDIA-NeMo/Megatron-Bridge at commit ``605c816715291f876ed470034459b6b007e82bac`` (the last
commit with that path: the next one, 4d7ce7908, moved the recipes under
``recipes/llama/h100/``). Every listed recipe sets ``sequence_parallel=True``,
``micro_batch_size=1``, ``global_batch_size=512``, ``virtual_pipeline_model_parallel_size=None``
and ``recompute_granularity=None``. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

BRIDGE_COMMIT = "605c816715291f876ed470034459b6b007e82bac"
RECIPE_FILE = "src/megatron/bridge/recipes/llama/llama3.py"


@dataclass(frozen=True)
class Recipe:
    """The parallel sizes of one Bridge recipe function."""

    function: str
    tp: int
    pp: int
    cp: int
    gbs: int = 512
    mbs: int = 1

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
