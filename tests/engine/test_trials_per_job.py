"""``executor.trials_per_job``: a number, or ``auto`` (the default): a world size's queued
trials spread evenly over the free job slots."""
import pytest

from hcp_tune import config
from hcp_tune.config.settings import AUTO_TRIALS_PER_JOB_MAX
from hcp_tune.engine import budget
from hcp_tune.errors import ConfigError


@pytest.mark.parametrize("queued, slots, expected", [
    (16, 1, 16),  # a CPU profile: one slot, the whole world size in one job
    (16, 4, 4),  # GPUs: four jobs side by side, four trials each
    (17, 4, 5),  # ceil: no fifth job waits for a slot
    (3, 8, 1),  # fewer trials than slots: one each
    (500, 1, AUTO_TRIALS_PER_JOB_MAX),  # a crashed batch sends back a bounded number
])
def test_auto_spreads_a_world_sizes_trials_over_the_free_slots(queued, slots, expected):
    assert budget.trials_per_job("auto", queued, slots) == expected


def test_a_number_is_taken_as_given():
    assert budget.trials_per_job(6, 100, 4) == 6
    assert budget.trials_per_job(1, 100, 1) == 1


def test_the_default_is_auto_and_a_cpu_profile_has_one_slot():
    cfg = config.load(["cp=2", "seq=256", "model=tiny", "cluster=local"])
    assert cfg.executor.trials_per_job == "auto"
    assert budget.job_slots(cfg) == 1


@pytest.mark.parametrize("value", ["0", "most", "2.5", "true"])
def test_a_bad_value_names_both_forms(value):
    with pytest.raises(ConfigError, match=r"executor.trials_per_job=.*expected auto, or an "
                                          r"integer in 1\.\.10000"):
        config.load(["cp=2", "seq=256", "model=tiny", "cluster=local",
                     f"executor.trials_per_job={value}"])


def test_the_estimate_shares_a_job_start_as_auto_packs_the_trials():
    base = ["cp=2", "seq=[256,512]", "model=tiny", "cluster=local"]
    from hcp_tune.costmodel import predict

    def seconds(setting):
        cfg = config.load([*base, f"executor.trials_per_job={setting}", "search.repeats=1",
                           "search.min_repeats=1"])
        return sum(c.seconds for c in budget.costs_by_layout(cfg, predict.ordering(cfg)).values())

    # four trials of one world size on one slot: auto packs them into one job
    assert seconds("auto") == pytest.approx(seconds(4))
    assert seconds("auto") < seconds(1)
