"""``executor.batch=steps``: one allocation runs a batch's trials one after another, each in
fresh processes (srun job steps on SLURM, new local processes on the local executor).
A step that crashes fails alone and the next step runs in the same allocation; a failure
that leaves the allocation unusable sends the rest back (SKIPPED, requeued); a stop file
there before a step keeps it from starting; a killed orchestrator resumes without losing or
re-measuring; the srun argv carries pyxis's named container."""
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml
from helpers import (
    TINY,
    hcp,
    make_spec,
    per_layout,
    result_file,
    rows,
    wait_for,
)

from hcp_tune.engine import dispatch
from hcp_tune.engine.dispatch import ExecutorConfig
from hcp_tune.job.steps import StepLaunch, run_steps, srun_argv
from hcp_tune.space.layout import Layout
from hcp_tune.spec import FailureClass, Status, result_from_json

STEPS = [*TINY, "search.early_stop=false", "executor.trials_per_job=6", "executor.batch=steps"]
DEFAULTS = yaml.safe_load((Path(__file__).parents[2] / "conf/executor/slurm.yaml").read_text())


# ---------------------------------------------------------------- the srun argv (no jobs)


def test_srun_argv_runs_the_trial_as_one_job_step(tmp_path):
    spec = make_spec(Layout(2, 2), trial_id="t1")
    launch = StepLaunch(nodes=1, tasks_per_node=4, python="/venv/bin/python",
                        srun_args=("--mpi=pmix",))
    argv = srun_argv(spec, tmp_path / "spec.json", tmp_path, launch, "77")
    assert argv == ["srun", "--job-name=hcp-tune-step-t1", "--nodes=1", "--ntasks=4",
                    "--ntasks-per-node=4", f"--output={tmp_path}/rank%t.log",
                    "--distribution=block", "--mpi=pmix",
                    "/venv/bin/python", "-u", "-m", "hcp_tune.job.steps",
                    str(tmp_path / "spec.json")]
    assert not [a for a in argv if a.startswith("--container")]


def test_srun_steps_ask_for_the_nodes_gpus_and_each_rank_binds_the_one_it_sees(tmp_path):
    """issue 19: steps asked for no GPUs (a site that does not hand a step the job's GPUs
    gave them none). Asked for explicitly now; a user's --gpus-per-task=1 --gpu-bind=single
    makes each task see one GPU, and then Bridge must be told GPU 0, not the local rank."""
    from hcp_tune.job.bridge.runner import device_fields, launcher_env
    from hcp_tune.job.dist import DistEnv
    from hcp_tune.job.failures import EnvironmentProblem

    cfg = ExecutorConfig.from_mapping({**DEFAULTS, "extra_srun": ["--gpus-per-task=1",
                                                                  "--gpu-bind=single"]})
    launch = dispatch.step_launch(cfg, world_size=16, gpus_per_node=8)
    argv = srun_argv(make_spec(Layout(4, 4)), tmp_path / "s.json", tmp_path, launch, "9")
    assert "--gpus-per-node=8" in argv and "--gpus-per-task=1" in argv
    assert "--gpus-per-node=0" not in srun_argv(
        make_spec(Layout(4, 4)), tmp_path / "s.json", tmp_path,
        dispatch.step_launch(cfg, world_size=16, gpus_per_node=0), "9")
    # local rank 5 of a node, one visible GPU: bind_device bound index 5 % 1 = 0
    env = DistEnv(rank=13, local_rank=5, world_size=16, master_addr="n0", master_port=1,
                  source="slurm")
    # issue 30: LOCAL_RANK stays the task's (every task claiming 0 ran Megatron-Core's
    # compile_helpers at once); Bridge is told GPU 0 through external_gpu_device_mapping
    assert launcher_env(env)["LOCAL_RANK"] == "5" and launcher_env(env)["RANK"] == "13"
    assert device_fields(5, 0) == {"dist.external_gpu_device_mapping": True}
    assert device_fields(5, 5) == {}  # all GPUs visible: set_device(LOCAL_RANK) is right
    assert device_fields(5, None) == {}  # no CUDA (the test double)
    with pytest.raises(EnvironmentProblem, match="cuda:2"):
        device_fields(5, 2)  # two GPUs a task: neither LOCAL_RANK nor 0 names it


def test_srun_argv_names_the_pyxis_container_per_allocation(tmp_path):
    """Every step passes the image and the allocation's container name: pyxis imports the
    image on the first step and, the name existing, reuses that container for the rest."""
    cfg = ExecutorConfig.from_mapping({
        **DEFAULTS, "container_image": "nvcr.io/nvidia/nemo:25.07", "python": "python3",
        "container_mounts": ["/data:/data", "/home:/home"], "extra_srun": ["--mpi=pmix"]})
    launch = dispatch.step_launch(cfg, world_size=16, gpus_per_node=8)
    assert (launch.nodes, launch.tasks_per_node, launch.python) == (2, 8, "python3")
    first, later = (srun_argv(make_spec(Layout(4, 4), trial_id=t), tmp_path / "s.json",
                              tmp_path, launch, "4242") for t in ("a", "b"))
    for argv in (first, later):
        assert argv[1:5] == ["--job-name=" + argv[1].split("=")[1], "--nodes=2", "--ntasks=16",
                             "--ntasks-per-node=8"]
        flags = [a for a in argv if a.startswith("--container")]
        assert flags == ["--container-image=nvcr.io/nvidia/nemo:25.07",
                         "--container-name=hcp-tune-4242",
                         "--container-mounts=/data:/data,/home:/home"]
        # pyxis flags and the user's srun flags come before the command srun runs
        assert argv.index("--mpi=pmix") < argv.index("python3")
        assert max(argv.index(f) for f in flags) < argv.index("python3")
    assert first[1] == "--job-name=hcp-tune-step-a" and later[1] == "--job-name=hcp-tune-step-b"


@pytest.mark.parametrize("image", [None, "nvcr.io/nvidia/nemo:25.07"])
def test_a_steps_job_script_runs_one_driver_without_srun(tmp_path, fake_srun, image):
    cfg = ExecutorConfig.from_mapping({**DEFAULTS, "name": "slurm", "python": "/in/image/python",
                                       "container_image": image})
    ex = dispatch.make_executor(cfg, world_size=4, gpus_per_node=8, folder=tmp_path)
    plain = ex._make_submission_file_text(ex._submitit_command_str, "u")
    assert re.search(r"^srun .*--container-image", plain, re.M) or not image
    dispatch.use_steps(ex, cfg)
    script = ex._make_submission_file_text(ex._submitit_command_str, "u")
    command = script.split("# command\n", 1)[1]
    assert "srun" not in command and "--container" not in command
    assert "#SBATCH --ntasks-per-node=4" in script  # the allocation is the trial's
    # with a container the driver runs outside it, on this interpreter; the ranks use python
    driver = command.splitlines()[1].split()[0]
    assert driver == (sys.executable if image else "/in/image/python")


# ---------------------------------------------------------------- configuration


def test_batch_mode_is_checked_at_load_in_one_line():
    r = hcp("sweep", "executor.batch=threads", "cluster=local", "model=tiny")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("hcp-tune: error: executor.batch='threads': expected one of "
                                "processes, steps, auto")


@pytest.mark.parametrize("runner,batch,steps,per_job", [
    ("bridge", "auto", True, 3), ("bridge", "processes", False, 1),
    ("attention", "auto", False, 3), ("attention", "steps", True, 3)])
def test_auto_runs_bridge_as_steps_and_batches_it(tmp_path, runner, batch, steps, per_job):
    from hcp_tune import config
    from hcp_tune.engine.sweep import Sweeper

    cfg = config.load(["cluster=local", "model=tiny", "cp=2", "seq=[256,512]",
                       f"runner={runner}", f"executor.batch={batch}", "executor=local",
                       "executor.trials_per_job=3", "search.repeats=1", "search.min_repeats=1",
                       f"results_dir={tmp_path}"])
    sweeper = Sweeper(cfg, reporter=None)
    assert sweeper.steps is steps
    sweeper.plan()
    assert len(sweeper.queue) == 4
    assert len(sweeper._take_batch(free=1)) == per_job


# ---------------------------------------------------------------- the driver, local steps


def test_a_restarted_driver_keeps_what_its_job_measured_before(tmp_path):
    """SLURM may requeue and restart a job: a trial whose result this job already wrote is
    returned as it is, not measured again (the orchestrator removes stale result files
    before it submits)."""
    from hcp_tune.spec import TrialResult, to_json

    done = tmp_path / "done.result.json"
    done.write_text(to_json(TrialResult(trial_id="done", status=Status.OK, median_s=0.5)))
    spec = make_spec(Layout(1, 2), trial_id="done", result_path=str(done))
    (res,) = run_steps([spec], None, tmp_path / "w")
    assert (res.status, res.median_s) == (Status.OK, 0.5)
    assert not (tmp_path / "w" / "done").exists()  # no step was started


@pytest.mark.multiproc
def test_a_stop_file_keeps_a_step_from_starting(tmp_path):
    stop = tmp_path / "first.stop"
    stop.write_text("stopped early: slower than the best")
    specs = [make_spec(Layout(1, 2), trial_id="first", stop_path=str(stop),
                       result_path=str(tmp_path / "first.result.json")),
             make_spec(Layout(1, 2), trial_id="second", stop_path=str(tmp_path / "none.stop"),
                       result_path=str(tmp_path / "second.result.json"))]
    first, second = run_steps(specs, None, tmp_path / "w")
    assert first.status == Status.PRUNED and first.error == "stopped early: slower than the best"
    assert not (tmp_path / "w" / "first").exists()  # no processes were started for it
    assert result_from_json((tmp_path / "first.result.json").read_text()).status == Status.PRUNED
    assert second.status == Status.OK
    assert any(n.startswith("fresh processes: local processes") for n in second.notes)


@pytest.mark.multiproc
def test_a_stop_file_reaches_a_running_step_and_the_next_step_runs(tmp_path):
    """What early stop uses inside a batch: the running step's ranks check the stop file."""
    import threading

    progress, stop = tmp_path / "long.jsonl", tmp_path / "long.stop"
    specs = [make_spec(Layout(1, 2), trial_id="long", measure_steps=100000,
                       progress_path=str(progress), stop_path=str(stop),
                       result_path=str(tmp_path / "long.result.json")),
             make_spec(Layout(1, 2), trial_id="next", result_path=str(tmp_path / "next.result.json"))]
    got = []
    driver = threading.Thread(target=lambda: got.extend(run_steps(specs, None, tmp_path / "w")))
    driver.start()
    wait_for(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 2,
             timeout_s=300, what="the long trial measuring")
    stop.write_text("stopped early: slower than the best")
    driver.join(timeout=300)
    assert not driver.is_alive()
    long, nxt = got
    assert long.status == Status.PRUNED and long.error == "stopped early: slower than the best"
    assert 2 <= len(long.step_times_s) < 100000
    assert nxt.status == Status.OK


def _hang_then_ok(tmp_path):
    """A trial whose last rank stops answering at its first measured step (rank 0 then
    waits in a collective, its comm timeout far away), then a healthy one."""
    return [make_spec(Layout(1, 2), trial_id="hang", inject_fault="hang_rank",
                      comm_timeout_s=600.0, time_limit_s=8.0,
                      result_path=str(tmp_path / "hang.result.json")),
            make_spec(Layout(1, 2), trial_id="ok", result_path=str(tmp_path / "ok.result.json"))]


def _check_hang_then_ok(results):
    hang, ok = results
    assert (hang.status, hang.failure_class) == (Status.FAILED, FailureClass.TIME_LIMIT)
    assert hang.error.startswith("time limit: the step passed the driver's limit of 8s")
    assert ok.status == Status.OK  # a timed-out step does not break the next one


@pytest.mark.multiproc
def test_the_driver_ends_a_step_past_its_time_limit_and_goes_on(tmp_path):
    _check_hang_then_ok(run_steps(_hang_then_ok(tmp_path), None, tmp_path / "w", startup_s=0.0))


@pytest.mark.multiproc
def test_an_environment_failure_gives_up_the_allocation(tmp_path):
    """Fresh processes do not help when the environment is wrong: the rest are not run
    (SKIPPED), which the orchestrator requeues."""
    specs = [make_spec(Layout(1, 2), trial_id="env", runner="model",
                       result_path=str(tmp_path / "env.result.json")),
             make_spec(Layout(1, 2), trial_id="after", result_path=str(tmp_path / "after.result.json"))]
    env, after = run_steps(specs, None, tmp_path / "w")
    assert (env.status, env.failure_class) == (Status.FAILED, FailureClass.ENVIRONMENT)
    assert after.status == Status.SKIPPED and "left the allocation unusable" in after.error
    assert result_from_json((tmp_path / "after.result.json").read_text()).status == Status.SKIPPED


@pytest.mark.multiproc
def test_steps_payload_unpickles_and_runs_without_orchestrator_libraries(tmp_path):
    from helpers import payload_spec, run_pickled_payload

    from hcp_tune.engine.sweep import steps_payload  # what the sweep pickles

    assert steps_payload.__module__.startswith("hcp_tune.job.")
    spec = payload_spec(1, 2, "two-ranks")
    proc = run_pickled_payload(tmp_path, steps_payload, [spec], None, str(tmp_path / "steps"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "payload ran: ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]


# ---------------------------------------------------------------- real SLURM


def _steps(row_result):
    """(job step, rank 0 pid) from the note the step's rank 0 left in its result."""
    note = next(n for n in row_result.notes if n.startswith("fresh processes: SLURM step"))
    m = re.match(r"fresh processes: SLURM step (\d+)\.(\d+), rank 0 pid (\d+)", note)
    return m.group(1), m.group(2), m.group(3)


@pytest.mark.slurm
def test_steps_batch_runs_each_trial_fresh_in_one_allocation_past_a_crash(slurm_cluster, tmp_path):
    """Four trials, one SLURM job, four job steps; the 512 trials' processes crash (a rank
    exits mid-trial) and run first: they fail as comm, and the next steps still run in the
    allocation."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=[512,1024]", *STEPS,
            "executor=slurm", f"results_dir={res}", fault="kill_rank@512")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(s, a): 1 for s in (512, 1024) for a in (1, 2)}
    assert {(x["seq"], x["status"], x["failure_class"]) for x in got} == {
        (512, "failed", "comm"), (1024, "ok", "")}
    assert len({x["job_id"] for x in got}) == 1  # one allocation ran all four
    steps = [_steps(result_file(res, x)) for x in got]
    assert {job for job, _, _ in steps} == {got[0]["job_id"]}
    assert len({step for _, step, _ in steps}) == 4 and len({pid for _, _, pid in steps}) == 4
    crashed = max(int(step) for (_, step, _), x in zip(steps, got) if x["seq"] == 512)
    assert any(int(step) > crashed for (_, step, _), x in zip(steps, got) if x["seq"] == 1024)
    assert "requeued" not in r.stdout


@pytest.mark.slurm
def test_the_driver_ends_an_srun_step_past_its_time_limit_and_goes_on(slurm_cluster, tmp_path):
    import functools

    from helpers import wait_for as wait

    cfg = ExecutorConfig.from_mapping({**DEFAULTS, "name": "slurm", "time_limit_min": 10})
    ex = dispatch.make_executor(cfg, world_size=2, gpus_per_node=2, folder=tmp_path / "jobs")
    ex.update_parameters(gpus_per_node=None)  # the local cluster has no GPUs
    dispatch.use_steps(ex, cfg)
    launch = dataclasses.replace(dispatch.step_launch(cfg, world_size=2, gpus_per_node=2),
                                 gpus_per_node=0)  # the local cluster has no GPUs
    handle = dispatch.submit(ex, functools.partial(run_steps, startup_s=0.0),
                             _hang_then_ok(tmp_path), launch, str(tmp_path / "w"))
    outcome = []
    wait(lambda: outcome.append(dispatch.poll(handle)) or outcome[-1].finished,
         timeout_s=400, what="the steps job to end")
    assert outcome[-1].state == dispatch.JobState.DONE, outcome[-1].error
    _check_hang_then_ok(outcome[-1].result)
    assert "SLURM step" in " ".join(outcome[-1].result[1].notes)


@pytest.mark.slurm
def test_a_step_slurm_cannot_start_gives_up_the_allocation(slurm_cluster, tmp_path):
    """srun refuses the step (here: an argument it does not know): no rank ran, so the
    trial fails as environment and the rest of the batch is not run (SKIPPED: requeued)."""
    from helpers import wait_for as wait

    cfg = ExecutorConfig.from_mapping({**DEFAULTS, "name": "slurm", "time_limit_min": 5,
                                       "extra_srun": ["--no-such-srun-flag"]})
    ex = dispatch.make_executor(cfg, world_size=2, gpus_per_node=2, folder=tmp_path / "jobs")
    ex.update_parameters(gpus_per_node=None)  # the local cluster has no GPUs
    dispatch.use_steps(ex, cfg)
    launch = dataclasses.replace(dispatch.step_launch(cfg, world_size=2, gpus_per_node=2),
                                 gpus_per_node=0)  # the local cluster has no GPUs
    specs = [make_spec(Layout(1, 2), trial_id=t, result_path=str(tmp_path / f"{t}.result.json"))
             for t in ("first", "second")]
    handle = dispatch.submit(ex, run_steps, specs, launch, str(tmp_path / "w"))
    outcome = []
    wait(lambda: outcome.append(dispatch.poll(handle)) or outcome[-1].finished,
         timeout_s=300, what="the steps job to end")
    assert outcome[-1].state == dispatch.JobState.DONE, outcome[-1].error
    first, second = outcome[-1].result
    assert (first.status, first.failure_class) == (Status.FAILED, FailureClass.ENVIRONMENT)
    assert "no-such-srun-flag" in first.error
    assert second.status == Status.SKIPPED


@pytest.mark.slurm
def test_a_broken_allocation_loses_nothing_and_the_next_run_measures_the_rest(
        slurm_cluster, tmp_path):
    """Through the sweep: the first step cannot start (an environment failure), so the
    allocation is given up and the sweep stops: the batch's other trial is neither run nor
    requeued into a job that would fail the same way. Environment failures are measured
    again on the next run, which measures both, once."""
    res = tmp_path / "results"
    args = ["sweep", "cp=2", "seq=256", *STEPS, "executor=slurm", f"results_dir={res}"]
    r = hcp(*args, "executor.extra_srun=[--no-such-srun-flag]")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "requeued" not in r.stdout
    assert "stopped submitting after an environment failure" in r.stderr
    assert "1 trial(s) not run: fix the environment and run the same command again" in r.stderr
    got = rows(res)
    assert [(x["status"], x["failure_class"]) for x in got] == [("failed", "environment")]
    r = hcp(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [x for x in rows(res) if x["status"] == "ok"]
    assert sorted(x["a2a"] for x in ok) == [1, 2] and len({x["job_id"] for x in ok}) == 1


def test_a_local_steps_batch_measures_every_rank_in_its_place(tmp_path):
    """executor=local, batch=steps: the driver is one submitit task; the ranks it starts
    must not read its submitit variables (rank 0 of 1) but their own."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=[256,512]", *STEPS, "executor=local", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(s, a): 1 for s in (256, 512) for a in (1, 2)}
    assert {(x["status"], x["verified"]) for x in got} == {("ok", True)}
    assert len({x["job_id"] for x in got}) == 1  # one driver ran the four trials
