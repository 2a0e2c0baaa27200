"""runner=bridge end to end on a machine without the training stack, and its failure classes.

Neither Megatron-Bridge nor Transformer Engine can be installed here (Bridge imports TE,
TE needs CUDA): the job must find that out first and say which is missing, the sweep must
stop with exit 1 and that message, through the local executor and the local SLURM
cluster. The failure texts below are the real ones, with their sources.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune.job.batch import run_trials
from hcp_tune.job.bridge import runner as bridge_runner
from hcp_tune.spec import FailureClass, Status, TrialSpec, classify_error_text

ROOT = Path(__file__).resolve().parents[3]


def spec(trial_id="b1", **kw):
    base = dict(trial_id=trial_id, a2a=2, p2p=1, seq=256, heads=8, kv_heads=8, head_dim=8,
                hidden=64, ffn_hidden=256, layers=2, vocab=1024, runner="bridge")
    base.update(kw)
    return TrialSpec(**base)


def test_stack_absent_here_names_both_and_the_fix():
    msg = bridge_runner.missing_stack()
    assert msg.startswith("runner=bridge: Transformer Engine (transformer_engine) and "
                          "Megatron-Bridge (megatron.bridge) not importable by the job's Python")
    assert sys.executable in msg and "executor.container_image" in msg


def test_only_the_missing_one_is_named(monkeypatch):
    monkeypatch.setattr(bridge_runner, "_importable", lambda m: m == "transformer_engine")
    msg = bridge_runner.missing_stack()
    assert "Megatron-Bridge (megatron.bridge) not importable" in msg
    assert "Transformer Engine" not in msg
    monkeypatch.setattr(bridge_runner, "_importable", lambda m: True)
    assert bridge_runner.missing_stack() is None


def test_trial_without_the_stack_is_an_environment_failure_before_anything_else():
    # no launcher environment, no process group: the stack check comes first
    res = bridge_runner.run_bridge_trial(spec())
    assert res.status == Status.FAILED and res.failure_class == FailureClass.ENVIRONMENT
    assert res.error.startswith("EnvironmentProblem: runner=bridge: Transformer Engine")
    assert res.backend == "bridge" and res.wall_s is not None


def test_bridge_trials_run_one_per_process():
    out = run_trials([spec("first"), spec("second")])
    assert out[0].failure_class == FailureClass.ENVIRONMENT
    assert out[1].status == Status.SKIPPED
    assert out[1].error == "not run: Bridge trials run one per process (first ran here)"


# ---------------------------------------------------------------- failure classes
# real texts: torch's CUDA caching allocator, torch's ProcessGroupNCCL watchdog, SLURM's
# slurmstepd, Megatron-Core's TEDotProductAttention (Megatron-LM cd4afffa648426a9
# extensions/transformer_engine.py), Megatron-Bridge v0.6.0 training/config.py and
# initialize.py, Python's import system.

@pytest.mark.parametrize("text,cls", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
     "capacity of 79.10 GiB of which 1.06 GiB is free.", FailureClass.OOM),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
     "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds "
     "before timing out.", FailureClass.COMM),
    ("slurmstepd: error: *** JOB 1234 ON node7 CANCELLED AT 2026-12-02T17:00:00 DUE TO TIME "
     "LIMIT ***", FailureClass.TIME_LIMIT),
    ("AssertionError: Transformer-Engine v1.11.0 must be >= 1.12.0 to supporthierarchical cp "
     "commucation.", FailureClass.ENVIRONMENT),
    ("AssertionError: Only Transformer-Engine version >= 1.0.0 supports context parallelism!",
     FailureClass.ENVIRONMENT),
    ("ModuleNotFoundError: No module named 'megatron.bridge'", FailureClass.ENVIRONMENT),
    ("AssertionError: Sequence length must be divisible by 2 * context parallel size if context "
     "parallel is used.", FailureClass.CONFIG),
    ("AssertionError: hierarchical_context_parallel_sizes must be set when cp_comm_type contains "
     "'a2a+p2p'. Without it, CP communication is silently disabled", FailureClass.CONFIG),
    ("AssertionError: Product of hierarchical_context_parallel_sizes [2, 2] (=4) must equal "
     "context_parallel_size (=8).", FailureClass.CONFIG),
    ("NotImplementedError: Decentralized process groups (use_decentralized_pg=True) do not "
     "support hierarchical context parallelism", FailureClass.CONFIG),
    ("BridgeConfigError: model.seqlen: no field 'seqlen' on GPTModelProvider in this Bridge's "
     "ConfigContainer", FailureClass.CONFIG),
])
def test_real_error_texts_are_classified(text, cls):
    assert classify_error_text(text) == cls


# ---------------------------------------------------------------- the sweep

def _sweep(tmp_path, executor):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", "runner=bridge", "cluster=local",
         "model=tiny", "cp=2", "seq=256", f"executor={executor}",
         f"results_dir={tmp_path / 'results'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _assert_environment_stop(proc):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "stopped submitting after an environment failure (EnvironmentProblem: runner=bridge: " \
           "Transformer Engine (transformer_engine) and Megatron-Bridge (megatron.bridge) not " \
           "importable" in proc.stderr
    assert "stored 1 trial(s) (1 failed)" in proc.stdout


@pytest.mark.multiproc
def test_sweep_local_executor_stops_on_the_missing_stack(tmp_path):
    _assert_environment_stop(_sweep(tmp_path, "local"))


@pytest.mark.slurm
def test_sweep_slurm_stops_on_the_missing_stack(tmp_path, slurm_cluster):
    _assert_environment_stop(_sweep(tmp_path, "slurm"))


# ---------------------------------------------------------------- configuration

def test_runner_bridge_conf_and_spec_carry_recipe_and_overrides(tmp_path):
    from hcp_tune import config
    from hcp_tune.engine.trials import spec_for
    from hcp_tune.space.plan import candidates

    cfg = config.load(["runner=bridge", "cluster=local", "model=tiny", "cp=2", "seq=256",
                       "runner.recipe=llama32_1b_pretrain_config",
                       'runner.overrides=["model.recompute_granularity=full"]'])
    assert cfg.runner.name == "bridge" and cfg.runner.warmup_steps == 3
    cand = next(c for c in candidates(cfg) if c.kept)
    s = spec_for(cfg, cand, "t", tmp_path)
    assert s.runner == "bridge" and s.bridge_recipe == "llama32_1b_pretrain_config"
    assert s.bridge_overrides == ["model.recompute_granularity=full"]


def test_bad_override_is_one_line_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "plan", "runner=bridge", "cluster=local", "model=tiny",
         "cp=2", "seq=256", 'runner.overrides=["modle.seq_length=4"]'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("hcp-tune: error: runner.overrides: 'modle.seq_length=4': "
                                  "'modle' is not a ConfigContainer section")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_ported_flops_reads_the_model_as_bridge_resolved_it():
    from types import SimpleNamespace

    from hcp_tune.flops import bridge_gpt_flops

    model = SimpleNamespace(seq_length=256, num_layers=2, hidden_size=64, ffn_hidden_size=256,
                            num_attention_heads=8, num_query_groups=None, kv_channels=None,
                            vocab_size=1000, tensor_model_parallel_size=1, gated_linear_unit=True,
                            make_vocab_size_divisible_by=128)
    cfg = SimpleNamespace(model=model, train=SimpleNamespace(global_batch_size=2))
    assert bridge_runner.ported_flops(cfg, spec()) == bridge_gpt_flops(
        batch=2, seq=256, layers=2, hidden=64, ffn_hidden=256, heads=8, kv_heads=8,
        head_dim=8, vocab=1000)
    assert bridge_runner.ported_flops(SimpleNamespace(model=None, train=None), spec()) is None


def test_log_fallback_reads_the_last_ranks_log(monkeypatch, tmp_path):
    monkeypatch.setenv("HCP_TUNE_LOG", str(tmp_path / "rank0.log"))
    assert bridge_runner.last_rank_log(4) == tmp_path / "rank3.log"
    monkeypatch.delenv("HCP_TUNE_LOG")
    assert bridge_runner.last_rank_log(4) is None
