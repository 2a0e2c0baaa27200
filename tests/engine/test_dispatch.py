"""hcp_tune.engine.dispatch: executor config, executor shape, and real jobs (local and SLURM)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import helpers
import pytest
import yaml

from hcp_tune.engine import dispatch
from hcp_tune.engine.dispatch import ExecutorConfig, JobState
from hcp_tune.errors import ConfigError

DEADLINE_S = 90  # a job on the idle local cluster starts within seconds
# the executor group's defaults are written once, in conf/executor/slurm.yaml
DEFAULTS = yaml.safe_load((Path(__file__).parents[2] / "conf/executor/slurm.yaml").read_text())


def executor(**kw) -> ExecutorConfig:
    return ExecutorConfig.from_mapping({**DEFAULTS, **kw})


def wait_for(handles, done, deadline_s=DEADLINE_S, on_poll=None):
    """Poll until ``done(outcomes)``; fail with the last outcomes past the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        outcomes = dispatch.poll_all(handles)
        if on_poll:
            on_poll(outcomes)
        if done(outcomes):
            return outcomes
        if time.monotonic() > end:
            pytest.fail(f"no expected state within {deadline_s}s: {[(o.state, o.scheduler_state) for o in outcomes]}")
        time.sleep(0.5)


def all_finished(outcomes):
    return all(o.finished for o in outcomes)


def slurm_cfg(**kw) -> ExecutorConfig:
    return executor(name="slurm", time_limit_min=2, **kw)


# ------------------------------------------------------------------ config validation


def test_unknown_key_is_named_with_the_valid_keys():
    with pytest.raises(ConfigError, match=r"executor\.partiton: unknown key; valid keys are: name, partition, ") as e:
        executor(name="slurm", partiton="batch")
    assert "\n" not in str(e.value)
    assert all(k in str(e.value) for k in ExecutorConfig.valid_keys())


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("name", "pbs", r"executor\.name='pbs': expected one of slurm, local, auto"),
        ("time_limit_min", 0, r"executor\.time_limit_min=0: expected an integer number of minutes >= 1"),
        ("time_limit_min", "10", r"executor\.time_limit_min='10': expected an integer"),
        ("array_parallelism", 0, r"executor\.array_parallelism=0: expected an integer >= 1"),
        ("gpus_per_node", -1, r"executor\.gpus_per_node=-1: expected null or an integer >= 0"),
        ("cpus_per_task", 0, r"executor\.cpus_per_task=0: expected null or an integer >= 1"),
        ("mem_gb", 0, r"executor\.mem_gb=0: expected null or a number of GiB > 0"),
        ("exclusive", "yes", r"executor\.exclusive='yes': expected true or false"),
        ("extra_sbatch", {"reservation": [1]}, r"executor\.extra_sbatch=.*: expected a mapping of sbatch flag"),
        ("setup", "module load cuda", r"executor\.setup='module load cuda': expected a list of strings"),
        ("partition", "", r"executor\.partition='': expected null or a non-empty string"),
    ],
)
def test_bad_value_is_named_with_the_expected_form(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        executor(**{key: value})


def test_missing_key_is_named():
    data = {k: v for k, v in DEFAULTS.items() if k != "qos"}
    with pytest.raises(ConfigError, match=r"^executor\.qos: missing \(SLURM QOS\)$"):
        ExecutorConfig.from_mapping(data)


@pytest.mark.parametrize(
    "key, value",
    [("time_limit_min", 1), ("array_parallelism", 1), ("gpus_per_node", 0), ("mem_gb", 0.5),
     ("extra_sbatch", {"reservation": "bench"}), ("setup", None), ("partition", None)],
)
def test_nearest_accepted_value(key, value):
    executor(**{key: value})


def test_auto_is_slurm_when_sbatch_is_on_path(tmp_path, monkeypatch):
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert dispatch.resolve_executor_name("auto") == "slurm"


def test_auto_is_local_without_sbatch(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert dispatch.resolve_executor_name("auto") == "local"
    assert dispatch.resolve_executor_name("slurm") == "slurm"


# ------------------------------------------------------------------ executor shape (no jobs)


def test_slurm_shape_fills_nodes_and_maps_every_field(tmp_path, fake_srun):
    cfg = slurm_cfg(
        partition="batch", account="acct", qos="high", cpus_per_task=12, mem_gb=64, exclusive=True,
        array_parallelism=3, extra_sbatch={"reservation": "bench"}, extra_srun=["--mpi=pmix"],
        container_image="nvcr.io/nvidia/nemo:25.07", container_mounts=["/data:/data", "/home:/home"],
        setup=["module load cuda"],
    )
    ex = dispatch.make_executor(cfg, world_size=16, gpus_per_node=8, folder=tmp_path)
    p = ex.parameters
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"]) == (2, 8, 8)
    assert (p["partition"], p["account"], p["qos"], p["cpus_per_task"], p["mem"]) == ("batch", "acct", "high", 12, "64GB")
    assert p["exclusive"] is True and p["array_parallelism"] == 3 and p["time"] == 2
    assert p["additional_parameters"] == {"reservation": "bench"} and p["setup"] == ["module load cuda"]
    assert p["srun_args"] == ["--mpi=pmix", "--container-image=nvcr.io/nvidia/nemo:25.07",
                              "--container-mounts=/data:/data,/home:/home"]


def test_slurm_shape_small_world_uses_part_of_a_node(tmp_path, fake_srun):
    ex = dispatch.make_executor(slurm_cfg(), world_size=4, gpus_per_node=8, folder=tmp_path)
    assert (ex.parameters["nodes"], ex.parameters["ntasks_per_node"], ex.parameters["gpus_per_node"]) == (1, 4, 8)


def test_slurm_shape_rejects_partial_nodes(tmp_path, fake_srun):
    with pytest.raises(ConfigError, match=r"world_size=12 is not a multiple of gpus_per_node=8"):
        dispatch.make_executor(slurm_cfg(), world_size=12, gpus_per_node=8, folder=tmp_path)


def test_slurm_without_srun_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"srun is not on PATH.*executor=local.*slurm-local\.sh start"):
        dispatch.make_executor(slurm_cfg(), world_size=1, gpus_per_node=8, folder=tmp_path)


# ------------------------------------------------------------------ local jobs


def test_local_job_returns_its_value(tmp_path):
    cfg = executor(name="local", time_limit_min=2)
    ex = dispatch.make_executor(cfg, world_size=1, gpus_per_node=0, folder=tmp_path)
    handle = dispatch.submit(ex, helpers.double, 21)
    (out,) = wait_for([handle], all_finished)
    assert (out.state, out.result, out.error) == (JobState.DONE, 42, None)
    again = dispatch.attach(tmp_path / "%j", handle.job_id, "local")
    assert dispatch.poll(again).result == 42


def test_local_failure_is_data(tmp_path):
    cfg = executor(name="local", time_limit_min=2)
    ex = dispatch.make_executor(cfg, world_size=1, gpus_per_node=0, folder=tmp_path)
    (out,) = wait_for([dispatch.submit(ex, helpers.boom, "local bad")], all_finished)
    assert (out.state, out.error) == (JobState.FAILED, "ValueError: local bad")


# ------------------------------------------------------------------ real SLURM jobs


@pytest.mark.slurm
def test_slurm_job_returns_its_value(slurm_cluster, tmp_path):
    ex = dispatch.make_executor(slurm_cfg(), world_size=1, gpus_per_node=8, folder=tmp_path)
    handle = dispatch.submit(ex, helpers.double, 21)
    (out,) = wait_for([handle], all_finished)
    assert (out.state, out.result, out.error) == (JobState.DONE, 42, None)
    assert out.stdout == tmp_path / handle.job_id / f"{handle.job_id}_0_log.out" and out.stdout.exists()


@pytest.mark.slurm
def test_slurm_array_respects_parallelism_and_collects_all(slurm_cluster, tmp_path):
    ex = dispatch.make_executor(slurm_cfg(array_parallelism=2), world_size=1, gpus_per_node=8, folder=tmp_path)
    handles = dispatch.submit_array(ex, helpers.double, [(i,) for i in range(4)])
    assert len({h.job_id.split("_")[0] for h in handles}) == 1  # one array job
    running: list[int] = []
    outs = wait_for(handles, all_finished,
                    on_poll=lambda os_: running.append(sum(o.state == JobState.RUNNING for o in os_)))
    assert [o.result for o in outs] == [0, 2, 4, 6]
    assert max(running) <= 2
    (submission,) = tmp_path.glob("*/*_submission.sh")
    assert "#SBATCH --array=0-3%2" in submission.read_text()


@pytest.mark.slurm
def test_slurm_failure_is_data_with_log_path(slurm_cluster, tmp_path):
    ex = dispatch.make_executor(slurm_cfg(), world_size=1, gpus_per_node=8, folder=tmp_path)
    handle = dispatch.submit(ex, helpers.boom, "trial went wrong")
    (out,) = wait_for([handle], all_finished)
    assert (out.state, out.error, out.result) == (JobState.FAILED, "ValueError: trial went wrong", None)
    assert out.stderr == dispatch.job_paths(handle)[1] and "trial went wrong" in out.stderr.read_text()
    assert str(out.stderr) in str(out.exception)


@pytest.mark.slurm
def test_slurm_cancel_of_a_running_job_ends_cancelled(slurm_cluster, tmp_path):
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    ex = dispatch.make_executor(slurm_cfg(), world_size=1, gpus_per_node=8, folder=tmp_path)
    handle = dispatch.submit(ex, helpers.block_on_fifo, str(fifo))
    wait_for([handle], lambda o: o[0].state == JobState.RUNNING)
    dispatch.cancel([handle])
    (out,) = wait_for([handle], all_finished)
    assert (out.state, out.scheduler_state) == (JobState.CANCELLED, "CANCELLED")


@pytest.mark.slurm
def test_slurm_attach_by_saved_id_gets_the_result(slurm_cluster, tmp_path):
    ex = dispatch.make_executor(slurm_cfg(), world_size=1, gpus_per_node=8, folder=tmp_path)
    saved = dispatch.submit(ex, helpers.double, 50).job_id
    del ex
    handle = dispatch.attach(tmp_path / "%j", saved, "slurm")  # as a restarted orchestrator would
    (out,) = wait_for([handle], all_finished)
    assert (out.state, out.result) == (JobState.DONE, 100)


@pytest.mark.slurm
def test_slurm_multi_task_job_runs_fn_on_every_rank(slurm_cluster, tmp_path):
    ex = dispatch.make_executor(slurm_cfg(), world_size=2, gpus_per_node=8, folder=tmp_path)
    assert ex.parameters["ntasks_per_node"] == 2
    handle = dispatch.submit(ex, helpers.rank_report)
    (out,) = wait_for([handle], all_finished)
    assert out.state == JobState.DONE
    assert (out.result["global_rank"], out.result["num_tasks"]) == (0, 2)  # task 0's result
    ranks = [handle.job.task(t).result()["global_rank"] for t in range(2)]
    assert ranks == [0, 1]


def _running_local_job(tmp_path):
    """A local job that runs until it is ended (its task waits on a fifo no one writes)."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    cfg = executor(name="local", time_limit_min=2)
    ex = dispatch.make_executor(cfg, world_size=1, gpus_per_node=0, folder=tmp_path)
    handle = dispatch.submit(ex, helpers.block_on_fifo, str(fifo))
    wait_for([handle], lambda o: o[0].state == JobState.RUNNING)
    return handle, fifo


def test_local_cancel_of_a_running_job_ends_cancelled(tmp_path):
    handle, _ = _running_local_job(tmp_path)
    dispatch.cancel([handle])
    (out,) = wait_for([handle], all_finished)
    assert out.state == JobState.CANCELLED


def test_a_local_job_killed_from_outside_ends_cancelled_live_and_reattached(tmp_path):
    """A local job's controller killed by a signal (with its sweep's process group: CI,
    2026-12-07, stored such a trial as failed, 'ended (ENDED) without a result', and the
    resumed sweep never measured it again) is cancelled, by the sweep that started it and
    by a later one that re-attaches it: ended from outside, measured again."""
    import signal

    from hcp_tune.engine.trials import failed_from_job

    handle, fifo = _running_local_job(tmp_path)
    os.kill(int(handle.job_id), signal.SIGKILL)  # the controller; its task waits on the fifo
    try:
        (out,) = wait_for([handle], all_finished)
        assert (out.state, out.scheduler_state) == (JobState.CANCELLED, "SIGKILL")
        again = dispatch.poll(dispatch.attach(tmp_path / "%j", handle.job_id, "local"))
        assert (again.state, again.scheduler_state) == (JobState.CANCELLED, "KILLED")
        spec = helpers.make_spec(helpers.Layout(1, 2), trial_id="t")
        res = failed_from_job(spec, again)
        assert res.status.value == "cancelled" and "measured again" in res.error, res.error
    finally:  # the orphaned task reads its fifo's end and exits (ENXIO: it is gone)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_config_from_a_hydra_node():
    from omegaconf import OmegaConf

    node = OmegaConf.create({**DEFAULTS, "name": "slurm", "setup": ["module load cuda"],
                             "extra_sbatch": {"reservation": "b"}})
    cfg = ExecutorConfig.from_mapping(node)
    assert (cfg.setup, cfg.extra_sbatch) == (["module load cuda"], {"reservation": "b"})
