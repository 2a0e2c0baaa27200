"""Recipes without the network (issue 19): a recipe's ``AutoBridge.from_hf_pretrained`` is
answered offline, from the cache, else from the trial's dimensions through
``AutoBridge.from_hf_config``, else one line saying what to set. The recipe module and its
``AutoBridge`` here are stand-ins built in the test (no Bridge on CPU machines)."""
from __future__ import annotations

import sys
import types

import pytest

from hcp_tune.job.bridge.offline import RecipeNeedsFiles, call_recipe


class AutoBridgeStandIn:
    """What the recipe module imports as ``AutoBridge``: offline, nothing is cached."""

    seen: list = []

    @classmethod
    def from_hf_pretrained(cls, path, **kw):
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {path}")

    @classmethod
    def from_hf_config(cls, config):
        cls.seen.append(config)
        return types.SimpleNamespace(to_megatron_provider=lambda load_weights=True: types.SimpleNamespace(
            num_layers=config["layers"], pipeline_model_parallel_size=1))


@pytest.fixture
def recipe_module():
    mod = types.ModuleType("recipe_module_standin")
    mod.AutoBridge = AutoBridgeStandIn

    def llama3_8b_128k_pretrain_config():
        model = mod.AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-8B").to_megatron_provider(
            load_weights=False)
        model.pipeline_model_parallel_size = 2  # the recipe's PP
        return types.SimpleNamespace(model=model)

    llama3_8b_128k_pretrain_config.__module__ = mod.__name__
    mod.llama3_8b_128k_pretrain_config = llama3_8b_128k_pretrain_config
    sys.modules[mod.__name__] = mod
    AutoBridgeStandIn.seen = []
    yield mod
    del sys.modules[mod.__name__]


def test_an_uncached_recipe_config_is_built_from_the_trials_dimensions(recipe_module):
    cfg = call_recipe(recipe_module.llama3_8b_128k_pretrain_config, name="llama3_8b_128k",
                      make_config=lambda path: {"layers": 32, "path": path})
    assert AutoBridgeStandIn.seen == [{"layers": 32, "path": "meta-llama/Meta-Llama-3-8B"}]
    assert cfg.model.num_layers == 32 and cfg.model.pipeline_model_parallel_size == 2
    assert recipe_module.AutoBridge is AutoBridgeStandIn  # restored after the call


def test_a_recipe_hcp_tune_cannot_describe_fails_in_one_line_with_the_fix(recipe_module):
    with pytest.raises(RecipeNeedsFiles) as e:
        call_recipe(recipe_module.llama3_8b_128k_pretrain_config, name="llama3_8b_128k",
                    make_config=lambda path: None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        "runner.recipe=llama3_8b_128k: needs the Hugging Face config of "
        "meta-llama/Meta-Llama-3-8B, which is not on this node")
    assert "HF_HOME" in msg and "drop runner.recipe" in msg
    assert recipe_module.AutoBridge is AutoBridgeStandIn


def test_the_failure_class_of_a_missing_recipe_config_is_environment():
    from hcp_tune.job.failures import classify

    cls, line = classify(RecipeNeedsFiles("runner.recipe=x: needs the Hugging Face config of y"))
    assert cls.value == "environment" and "runner.recipe=x: needs" in line


def test_the_stand_in_answers_every_class_attribute_of_autobridge(recipe_module):
    """issue 30: the shim answered only from_hf_pretrained as a class attribute (its
    __getattr__ served instances only); a recipe calling another AutoBridge classmethod
    failed. It is a subclass of the real one now."""
    AutoBridgeStandIn.supports = classmethod(lambda cls, path: f"yes {path}")

    def recipe():
        return recipe_module.AutoBridge.supports("meta-llama/Meta-Llama-3-8B")

    recipe.__module__ = recipe_module.__name__
    assert call_recipe(recipe, name="r", make_config=lambda path: None) == (
        "yes meta-llama/Meta-Llama-3-8B")


def test_the_profiles_dimensions_come_first_and_the_hub_is_never_asked(recipe_module):
    """issue 30: from_hf_pretrained was tried first (a download on every rank where the
    node had network and HF_HUB_OFFLINE set otherwise); a describable model is built from
    the profile's dimensions, and which source answered is noted."""
    from hcp_tune.job.bridge.offline import last_sources

    asked = []
    AutoBridgeStandIn.from_hf_pretrained = classmethod(lambda cls, path, **kw: asked.append(path))
    try:
        call_recipe(recipe_module.llama3_8b_128k_pretrain_config, name="r",
                    make_config=lambda path: {"layers": 2})
    finally:
        del AutoBridgeStandIn.from_hf_pretrained
    assert asked == [] and AutoBridgeStandIn.seen == [{"layers": 2}]
    assert last_sources() == ["meta-llama/Meta-Llama-3-8B: built from the model profile's "
                              "dimensions"]


@pytest.mark.parametrize("path,theta,factor", [
    ("meta-llama/Meta-Llama-3-8B", 500000.0, None),
    ("meta-llama/Llama-3.1-405B", 500000.0, 8.0),
    ("meta-llama/Llama-3.2-1B", 500000.0, 32.0),
    ("meta-llama/Llama-2-7b-hf", 10000.0, None),
])
def test_the_llama_fallback_has_the_generations_rope(path, theta, factor):
    """issue 30: the Llama fallback config had no rope_scaling (Llama 3.1+ has llama3's)."""
    from hcp_tune.job.bridge.offline import llama_rope

    got_theta, scaling = llama_rope(path)
    assert got_theta == theta
    assert (scaling or {}).get("factor") == factor
    if factor:
        assert scaling["rope_type"] == "llama3"
        assert scaling["original_max_position_embeddings"] == 8192
