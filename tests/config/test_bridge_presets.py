"""The sweeps/ presets that mirror Megatron-Bridge's long-context recipes: each plans, sits
at its recipe's TP/PP/CP (recipes.py, read from Bridge's source), cites the recipe
function, and keeps at least one split that fits the GPU's memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.config.recipes import BRIDGE_COMMIT, RECIPES
from hcp_tune.costmodel import predict

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "sweeps").glob("llama3-*-bridge.yaml"))


def test_there_is_a_preset_for_every_recipe_and_a_70b_one():
    assert len(PRESETS) == len(RECIPES) and any("70b" in p for p in PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_its_recipe_and_cites_it(name):
    cfg = config.load([f"sweeps={name}"])
    recipe = RECIPES[(cfg.model.name, cfg.seqs[0])]
    assert (cfg.tps, cfg.pp, cfg.cp, cfg.gbs) == ((recipe.tp,), recipe.pp, recipe.cp, recipe.gbs)
    text = (REPO / "sweeps" / f"{name}.yaml").read_text()
    assert recipe.function in text and BRIDGE_COMMIT in text


@pytest.mark.parametrize("name", PRESETS)
def test_preset_plans_with_its_whole_world_and_a_fitting_split(name):
    r = subprocess.run([sys.executable, "-m", "hcp_tune", "plan", f"sweeps={name}",
                        "format=json"], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    cfg = config.load([f"sweeps={name}"])
    world = cfg.tps[0] * cfg.cp * cfg.pp
    assert plan["candidates"] and all(c["world_size"] == world for c in plan["candidates"])
    assert any(c["kept"] for c in plan["candidates"])
    assert any("attention runner measures one stage" in n for n in plan["notes"])
    fits = [c for c in predict.predict_rows(cfg)["candidates"] if c["fits_memory"]]
    assert fits, name


def test_a_named_recipe_gives_its_pp_and_a_given_pp_wins_with_a_note():
    """issue 19: runner.recipe=llama3_70b_pretrain_config (PP=4, virtual pipeline 5 at
    Bridge v0.6.0) used to run at pp=1; the sweep's pp is what the world is built from."""
    base = ["runner=bridge", "runner.recipe=llama3_70b_pretrain_config", "model=llama3-70b",
            "cp=2", "seq=8192", "cluster=dgx-h100"]
    cfg = config.load(base)
    assert (cfg.tps, cfg.pp) == ((4,), 4) and "llama3_70b_pretrain_config" in cfg.recipe_note
    cfg = config.load([*base, "pp=2", "tp=4"])
    assert cfg.pp == 2 and cfg.recipe_note.startswith(
        "pp=2 (given) wins over runner.recipe=llama3_70b_pretrain_config's pp=4")
