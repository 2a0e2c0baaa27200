"""One way to check configuration: every group is a typed dataclass built at load; a bad
value in any group is one line naming the key and what it allows (exit 2 from the CLI)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.config.settings import (
    CP_MAX,
    DP_MAX,
    MBS_MAX,
    SEQ_MAX,
    TP_MAX,
    WORLD_MAX,
    ExecutorConfig,
    RunnerConfig,
    SearchConfig,
)
from hcp_tune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_every_group_is_typed_at_load():
    cfg = config.load([])
    assert isinstance(cfg.runner, RunnerConfig) and isinstance(cfg.search, SearchConfig)
    assert isinstance(cfg.executor, ExecutorConfig)
    assert (cfg.search.repeats, cfg.search.early_stop, cfg.search.retry) == (5, True, "none")
    assert (cfg.search.min_repeats, cfg.search.adaptive, cfg.search.tie_threshold) == (1, True, 0.02)
    assert (cfg.runner.backend, cfg.runner.warmup_steps) == ("auto", 2)


def test_options_inherit_the_group_defaults_written_once():
    local = config.load(["executor=local"]).executor
    assert (local.name, local.array_parallelism, local.time_limit_min, local.setup) == \
        ("local", 1, 30, [])
    model = config.load(["runner=model"]).runner
    assert (model.name, model.measure_steps) == ("model", 5)


@pytest.mark.parametrize("override,message", [
    ("search.repeats=abc", "search.repeats='abc': expected an integer in 1..100"),
    ("search.repeats=0", "search.repeats=0: expected an integer in 1..100"),
    ("search.early_stop=maybe", "search.early_stop='maybe': expected true or false"),
    ("search.order_by_prediction=1", "search.order_by_prediction=1: expected true or false"),
    ("search.retry=sometimes", "search.retry='sometimes': expected one of none, failed, oom"),
    ("search.retry=[oom,later]", "search.retry=['oom', 'later']: expected one of none"),
    ("search.storage=''", "search.storage='': expected null or a non-empty string"),
    ("runner.backend=tee", "runner.backend='tee': expected one of auto, te, torch"),
    ("runner.measure_steps=0", "runner.measure_steps=0: expected an integer in 1..1000000"),
    ("runner.time_limit_s=-5", "runner.time_limit_s=-5: expected a number > 0"),
    ("runner.inject_fault=cp_off", "runner.inject_fault: unknown key"),  # HCP_TUNE_INJECT_FAULT
    ("executor.array_parallelism=two", "executor.array_parallelism='two': expected an integer >= 1"),
    ("executor.exclusive=yes", "executor.exclusive='yes': expected true or false"),
    ("env_tag=''", "env_tag='': expected a non-empty string"),
    ("format=yaml", "format='yaml': expected one of table, json"),
    ("drop_cross_node_a2a=no", "drop_cross_node_a2a='no': expected true or false"),
])
def test_bad_value_in_any_group_names_the_key_and_allowed_values(override, message):
    with pytest.raises(ConfigError) as e:
        config.load([override])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("override", [
    "search.retry=failed", "search.retry=[oom,comm]", "search.repeats=100",
    "runner.warmup_steps=0", "runner.backend=torch",
    "search.skip_predicted_slower_than=1",
])
def test_nearest_accepted_values(override):
    config.load([override])


@pytest.mark.parametrize("key,top", [("cp", CP_MAX), ("seq", SEQ_MAX), ("tp", TP_MAX),
                                     ("dp", DP_MAX), ("mbs", MBS_MAX)])
def test_each_size_has_a_documented_range(key, top):
    for bad in (top + 1, 0):
        with pytest.raises(ConfigError, match=rf"^{key}={bad}: expected an integer in 1\.\.{top}$"):
            config.load([f"{key}={bad}", "cp=1"] if key != "cp" else [f"cp={bad}"])
    if key == "tp":  # in range: what stops tp=64 on an 8-head model is the heads rule
        with pytest.raises(ConfigError, match=r"^tp=64: \[heads-tp\]"):
            config.load(["tp=64", "cp=1", "model=tiny"])
    else:
        assert getattr(config.load([f"{key}={top}", "cp=1"] if key != "cp" else
                                   ["cp=1024", "seq=2048"]),
                       {"seq": "seqs"}.get(key, key)) in (top, (top,))


def test_the_world_of_one_trial_is_bounded():
    config.load(["cp=1024", f"dp={WORLD_MAX // 1024}", "seq=2048"])
    with pytest.raises(ConfigError,
                       match=rf"tp\*cp\*dp\*pp = 1\*1024\*{WORLD_MAX // 1024 + 1}\*1 = "):
        config.load(["cp=1024", f"dp={WORLD_MAX // 1024 + 1}", "seq=2048"])
    with pytest.raises(ConfigError, match=r"tp\*cp\*dp\*pp = 1\*1024\*8\*3 = 24576 GPUs"):
        config.load(["cp=1024", "dp=8", "pp=3", "seq=2048"])


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as e:
        config.load(["search.repeats=abc", "runner.backend=tee", "mbs=0"])
    lines = str(e.value).splitlines()
    assert len(lines) == 3 and {ln.split("=")[0] for ln in lines} == \
        {"search.repeats", "runner.backend", "mbs"}


def run(*args):
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ), timeout=120)


@pytest.mark.parametrize("args,line", [
    (["plan", "cp=99999999999999999999", "seq=131072"],
     "hcp-tune: error: cp=99999999999999999999: expected an integer in 1..1024"),
    (["sweep", "search.early_stop=maybe", "runner=model"],
     "hcp-tune: error: search.early_stop='maybe': expected true or false"),
    (["sweep", "runner.backend=tee", "cluster=local", "model=tiny"],
     "hcp-tune: error: runner.backend='tee': expected one of auto, te, torch"),
    (["predict", "search.repeats=abc"],
     "hcp-tune: error: search.repeats='abc': expected an integer in 1..100"),
    # issue 19: TE has no attention backend for CP in fp32 (flash and fused off, unfused no CP)
    (["plan", "runner=bridge", "dtype=fp32", "cluster=dgx-h100", "cp=8", "seq=131072"],
     "hcp-tune: error: dtype=fp32 with runner=bridge on cluster=dgx-h100 (a GPU profile): "
     "Transformer Engine turns its flash and fused attention off in fp32 and its unfused "
     "attention has no context parallelism, so no backend can run cp=8; use dtype=bf16 "
     "(Bridge's bf16_mixed) or dtype=fp16"),
])
def test_cli_refuses_at_load_in_one_line_exit_2(args, line):
    r = run(*args)
    assert r.returncode == 2 and r.stderr.strip() == line and r.stdout == ""


def test_fp32_bridge_is_refused_only_where_te_would_run_it():
    with pytest.raises(ConfigError, match=r"^dtype=fp32 with runner=bridge on cluster=dgx-h100"):
        config.load(["runner=bridge", "dtype=fp32", "cluster=dgx-h100", "cp=8"])
    # the nearest accepted cases: bf16 on the GPU profile; fp32 on a CPU profile (the double)
    assert config.load(["runner=bridge", "dtype=bf16", "cluster=dgx-h100", "cp=8"]).dtype == "bf16"
    assert config.load(["runner=bridge", "dtype=fp32", "cluster=local", "cp=2"]).dtype == "fp32"


def test_pp_gbs_and_recompute_load_and_gbs_must_divide_by_mbs_dp():
    cfg = config.load(["pp=4", "tp=2", "gbs=64", "dp=2", "recompute=full",
                       "recompute_method=block", "recompute_num_layers=3"])
    assert (cfg.pp, cfg.gbs, cfg.micro_batches) == (4, 64, 32)
    assert (cfg.recompute.granularity, cfg.recompute.method, cfg.recompute.num_layers) == \
        ("full", "block", 3)
    with pytest.raises(ConfigError, match=r"^gbs=3: must be a multiple of mbs\*dp = 1\*2 = 2 "):
        config.load(["gbs=3", "dp=2"])
    with pytest.raises(ConfigError, match=r"^pp=513: expected null or an integer in 1\.\.512$"):
        config.load(["pp=513"])
    with pytest.raises(ConfigError, match=r"^recompute='some': expected one of none, selective"):
        config.load(["recompute=some"])


def test_tp_and_pp_follow_the_bridge_recipe_unless_given():
    cfg = config.load(["cp=8", "seq=131072", "model=llama3-8b"])
    assert (cfg.tps, cfg.pp, cfg.gbs) == ((4,), 2, 512)
    assert "llama3_8b_128k_pretrain_config" in cfg.recipe_note
    cfg = config.load(["cp=8", "seq=131072", "model=llama3-8b", "tp=2"])
    assert (cfg.tps, cfg.pp) == ((2,), 2) and cfg.recipe_note.startswith("pp=2 follow")
    cfg = config.load(["cp=8", "seq=131072", "model=llama3-8b", "tp=1", "pp=1"])
    assert (cfg.tps, cfg.pp, cfg.recipe_note) == ((1,), 1, "")
    cfg = config.load(["cp=4", "seq=2048", "model=tiny", "cluster=local"])
    assert (cfg.tps, cfg.pp, cfg.gbs) == ((1,), 1, 1)
    assert "Bridge has no long-context recipe for model=tiny" in cfg.recipe_note
