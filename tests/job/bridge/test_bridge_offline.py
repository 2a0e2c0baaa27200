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
