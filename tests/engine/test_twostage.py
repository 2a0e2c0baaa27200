"""runner=attention+bridge: the attention stage picks, Bridge ranks, the table says whether
they agree. Rows are made by the store's own writer (store.trial_row)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.engine import twostage
from hcp_tune.store.folder import SweepKey, trial_row
from hcp_tune.spec import Status, TrialResult, TrialSpec

ROOT = Path(__file__).resolve().parents[2]
CFG = config.load(["runner=attention+bridge", "cluster=local", "model=tiny", "cp=4",
                   "seq=256", "search.repeats=1", "search.min_repeats=1"])


def row(runner, a2a, median, status=Status.OK, verification=None):
    key = SweepKey(cluster="local", model="tiny", tp=1, cp=4, seq=256, runner=runner,
                   env_tag="default")
    spec = TrialSpec(trial_id=f"{runner}-{a2a}", a2a=a2a, p2p=4 // a2a, seq=256, heads=8,
                     kv_heads=8, head_dim=8, runner=runner)
    ver = verification if verification is not None else (
        {"cp_active": {"checked": True, "problems": []}} if runner == "bridge" else
        {"groups": {"match": True}, "numerics": {"passed": True}})
    res = TrialResult(trial_id=spec.trial_id, status=status, median_s=median, p10_s=median,
                      p90_s=median, verification=ver)
    return trial_row(key, spec, res)


ATTENTION = [row("attention", 1, 0.30), row("attention", 2, 0.10), row("attention", 4, 0.20)]


def test_best_layouts_takes_the_k_fastest_verified():
    rows = ATTENTION + [row("attention", 4, 0.01, verification={"groups": {"match": False}})]
    picked = twostage.best_layouts(rows, CFG, 2)
    assert [r["a2a"] for r in picked[(1, 256)]] == [2, 4]  # the unverified 0.01 is not ranked


@pytest.mark.parametrize("bridge,best,matched", [
    ([row("bridge", 2, 1.0), row("bridge", 4, 1.2)], "[2,2]", True),
    ([row("bridge", 2, 1.3), row("bridge", 4, 1.2)], "[4,1]", False),
])
def test_compare_says_whether_the_attention_winner_held(bridge, best, matched):
    picked = twostage.best_layouts(ATTENTION, CFG, 2)
    (line,) = twostage.compare(ATTENTION + bridge, CFG, picked)
    assert line["attention_best"] == "[2,2]" and line["bridge_candidates"] == "[2,2] [4,1]"
    assert line["bridge_best"] == best and line["matched"] is matched


def test_bridge_rows_without_proof_are_not_ranked():
    picked = twostage.best_layouts(ATTENTION, CFG, 2)
    bad = row("bridge", 2, 0.5, verification={"cp_active": {"checked": True,
                                                            "problems": ["rank 0: no CP group"]}})
    (line,) = twostage.compare(ATTENTION + [bad], CFG, picked)
    assert line["bridge_best"] == "" and line["matched"] is None
    assert line["note"] == "Bridge stage ranked nothing (see its failed/invalid rows)"


def test_bridge_stage_queue_is_cut_to_the_chosen_layouts(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(twostage.stage_config(CFG, "bridge"), results_dir=tmp_path)
    stage = twostage.BridgeStage(cfg, reporter=None, chosen={(1, 256): {2, 4}})
    stage.plan()
    assert sorted(w.cand.layout.a2a for w in stage.queue) == [2, 4]


@pytest.mark.multiproc
def test_two_stage_sweep_measures_attention_then_stops_at_the_missing_bridge(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", "runner=attention+bridge", "cluster=local",
         "model=tiny", "cp=2", "seq=256", "executor=local", "runner.warmup_steps=1",
         "runner.measure_steps=2", f"results_dir={tmp_path / 'r'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Bridge stage: stopped submitting after an environment failure" in proc.stderr
    table = (tmp_path / "r" / "two_stage.csv").read_text().splitlines()
    assert table[0].startswith("cluster,model,tp,cp,seq,env_tag,attention_best")
    assert "Bridge stage ranked nothing" in table[1]
    assert "two-stage tp=1 seq=256: attention best [" in proc.stdout
