"""runner=auto decided in the engine (``engine/runner_choice.py``): no GPU and no SLURM
predicts with the cost model, either one measures; an asked-for runner passes through;
trial refuses the runners that measure nothing."""
import pytest

from hcp_tune import config
from hcp_tune.engine import runner_choice
from hcp_tune.errors import ConfigError


def test_runner_model_and_auto_are_options():
    assert config.load(["runner=model"]).runner.name == "model"
    assert config.load(["runner=auto"]).runner.name == "auto"


def test_auto_without_gpu_or_slurm_predicts_and_says_how_to_measure(monkeypatch):
    monkeypatch.setattr(runner_choice.shutil, "which", lambda name: None)
    runner, why = runner_choice.resolve_runner("auto")
    assert runner == "model"
    assert why == ("runner=auto: no GPU and no SLURM here: predicting with the cost model; "
                   "run on a cluster with executor=slurm runner=attention to measure")


@pytest.mark.parametrize("present", ["nvidia-smi", "sbatch"])
def test_auto_with_gpu_or_slurm_measures(monkeypatch, present):
    monkeypatch.setattr(runner_choice.shutil, "which",
                        lambda name: "/x" if name == present else None)
    runner, why = runner_choice.resolve_runner("auto")
    assert runner == "attention" and "measuring with runner=attention" in why


def test_explicit_runners_pass_through():
    assert runner_choice.resolve_runner("attention") == ("attention", "")
    assert runner_choice.resolve_runner("model")[0] == "model"
    with pytest.raises(ConfigError, match="runner.name='gpu': expected one of auto, attention"):
        config.load(["runner.name=gpu"])


@pytest.mark.parametrize("name, says", [("model", "runner=model only predicts"),
                                        ("synthetic", "a synthetic trial measures nothing")])
def test_trial_refuses_a_runner_that_measures_nothing(name, says):
    assert runner_choice.resolve_runner("auto", command="trial") == ("attention", "")
    with pytest.raises(ConfigError, match=says):
        runner_choice.resolve_runner(name, command="trial")


def test_a_sweep_of_model_or_synthetic_asks_no_slurm(monkeypatch):
    from hcp_tune.engine import slurm_probe

    monkeypatch.setattr(slurm_probe, "ask", lambda: pytest.fail("SLURM asked"))
    for name in ("model", "synthetic"):
        cfg = config.load([f"runner={name}", "executor=slurm"])
        assert runner_choice.sweep_runner(cfg)[0] == name
