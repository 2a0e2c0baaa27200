"""A kept allocation (``executor.keep_allocation``, issue 39): one job per world size that
takes the sweep's next batches (an adaptive round, a repeat, a broken batch's unrun trials),
each in fresh processes, through the real local executor and the local SLURM cluster; the
driver's other ways of starting a process set (new local interpreters, srun job steps: what
GPU trials use); and ``keep_allocation=false``, a job per batch."""
import dataclasses
import json
import re

import pytest
from helpers import TINY, hcp, make_spec, per_layout, result_file, rows, wait_for

from hcp_tune.engine import dispatch
from hcp_tune.engine.launch import default_executor
from hcp_tune.job.payload import pool_payload
from hcp_tune.job.pool import PoolFiles, write_specs
from hcp_tune.space.layout import Layout
from hcp_tune.spec import Status, result_from_json

SET = re.compile(r"process set (\d+) of allocation (\S+), pid (\d+)")


def process_set(note_holder) -> tuple[int, str, int]:
    """(set, allocation, rank 0's pid) from a result's note (``job.pool.rank_main``)."""
    (m,) = [m for m in map(SET.search, note_holder.notes) if m]
    return int(m.group(1)), m.group(2), int(m.group(3))


def sets_of(res) -> dict[str, tuple[int, str, int]]:
    return {x["trial_id"]: process_set(result_file(res, x)) for x in rows(res)}


@pytest.mark.multiproc
def test_an_adaptive_sweep_runs_its_rounds_in_fresh_processes_of_one_allocation(tmp_path):
    """The adaptive default: a round per look, each a new process set of the one job; a
    layout's repeats never share a set; the pool is told to end when the sweep is done."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=[256,512]", *TINY, "search.min_repeats=1",
            "search.repeats=3", "search.early_stop=false", "executor=local",
            f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)  # one trial a layout has no interval: every layout gets a second round
    assert {x["status"] for x in got} == {"ok"} and len(got) >= 8
    assert len({x["job_id"] for x in got}) == 1  # one allocation ran every round
    where = sets_of(res)
    assert len({s for s, _, _ in where.values()}) >= 2
    pids = {}
    for tid, (s, _, pid) in where.items():
        pids.setdefault(s, set()).add(pid)
    assert all(len(p) == 1 for p in pids.values())  # a set's trials share its processes
    assert len(set().union(*pids.values())) == len(pids)  # and every set has its own
    for seq in (256, 512):
        for a2a in (1, 2):
            mine = [where[x["trial_id"]][0] for x in got if (x["seq"], x["a2a"]) == (seq, a2a)]
            assert len(mine) == len(set(mine))  # repeats of a layout: different sets
    (pool,) = (res / "trials").glob("*.pool")
    events = [json.loads(x)["event"] for x in (pool / "timeline.jsonl").read_text().splitlines()]
    assert events == ["start", "warm", "end"] and (pool / "end").exists()
    done = [json.loads(p.read_text()) for p in sorted(pool.glob("batch-*.done.json"))]
    assert len(done) == len(pids) and {d["mode"] for d in done} == {"fork"}
    assert all(d["codes"] == [0, 0] and d["error"] is None for d in done)


@pytest.mark.multiproc
@pytest.mark.parametrize("keep", [True, False])
def test_repeats_run_in_other_processes_kept_allocation_or_not(tmp_path, keep):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=256", *TINY, "search.early_stop=false", "search.repeats=2",
            f"executor.keep_allocation={str(keep).lower()}", "executor=local",
            f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(256, 1): 2, (256, 2): 2}
    if keep:  # one job; each repeat in a process set of its own
        assert len({x["job_id"] for x in got}) == 1
        where = sets_of(res)
        for a2a in (1, 2):
            sets = {where[x["trial_id"]] for x in got if x["a2a"] == a2a}
            assert len({s for s, _, _ in sets}) == 2 and len({p for _, _, p in sets}) == 2
    else:  # a job per batch, as before the pools
        assert len({x["job_id"] for x in got}) == 2
        assert not list((res / "trials").glob("*.pool"))


@pytest.mark.multiproc
def test_a_regress_sweep_never_keeps_an_allocation(tmp_path):
    """search.purpose=regress: its spreads were recorded with a job per repeat."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=256", *TINY, "search.purpose=regress", "search.repeats=2",
            "executor=local", "env_tag=night1", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert len(got) == 4 and len({x["job_id"] for x in got}) == 2
    assert not list((res / "trials").glob("*.pool"))


def _two_sets(tmp_path):
    """Set 0's specs for the job; set 1's batch file and the end already written."""
    root = tmp_path / "pool"

    def spec(name, layout):
        return make_spec(layout, trial_id=name, device="cpu",
                         result_path=str(tmp_path / f"{name}.result.json"))

    files = PoolFiles(root)
    root.mkdir()
    write_specs(files.batch(1), [spec("c", Layout(2, 1)), spec("d", Layout(1, 2))])
    files.end.touch()
    return [spec("a", Layout(1, 2)), spec("b", Layout(2, 1))], root, files


def _read(tmp_path, name):
    return result_from_json((tmp_path / f"{name}.result.json").read_text())


def _drive(tmp_path, ex, first, root, launch):
    """Submit the two-set driver (``_two_sets``), wait for it, and check what both driver
    modes must give: every trial back and ok, sets 0 and 1 in order. (handle, rows, where)."""
    handle = dispatch.submit(ex, pool_payload, first, str(root), launch, False)
    wait_for(lambda: dispatch.poll(handle).finished, what="the driver to return at the end")
    out = dispatch.poll(handle).result
    assert sorted(r.trial_id for r in out) == ["a", "b", "c", "d"]
    got = {n: _read(tmp_path, n) for n in "abcd"}
    assert {r.status for r in got.values()} == {Status.OK}
    where = {n: process_set(r) for n, r in got.items()}
    assert [where[n][0] for n in "abcd"] == [0, 0, 1, 1]
    return handle, got, where


@pytest.mark.multiproc
def test_a_driver_without_fork_starts_each_set_as_new_local_interpreters(tmp_path):
    """What GPU trials on the local executor use (no fork: CUDA must not be in a parent)."""
    first, root, files = _two_sets(tmp_path)
    cfg = default_executor()
    ex = dispatch.make_executor(cfg, world_size=2, gpus_per_node=0, folder=tmp_path / "jobs",
                                tasks_per_node=1)
    _, got, where = _drive(tmp_path, ex, first, root, None)
    assert all(r.verification["numerics"]["passed"] for r in got.values())
    assert where["a"][2] == where["b"][2] != where["c"][2] == where["d"][2]
    for n in (0, 1):
        done = json.loads(files.done(n).read_text())
        assert done["mode"] == "local" and done["codes"] == [0, 0]
        assert (files.logs(n) / "rank1.log").exists()
    assert got["c"].log_path == str(files.logs(1) / "rank0.log")


@pytest.mark.slurm
def test_a_driver_on_slurm_without_fork_runs_each_set_as_an_srun_step(slurm_cluster, tmp_path):
    """What multi-node or containerised trials use: one srun job step per process set."""
    first, root, files = _two_sets(tmp_path)
    cfg = dataclasses.replace(default_executor(), name="slurm", time_limit_min=10)
    ex = dispatch.make_executor(cfg, world_size=2, gpus_per_node=0, folder=tmp_path / "jobs")
    dispatch.use_steps(ex, cfg)
    launch = dispatch.step_launch(cfg, world_size=2, gpus_per_node=0)
    handle, got, where = _drive(tmp_path, ex, first, root, launch)
    assert {where[n][1] for n in "abcd"} == {handle.job_id}  # one allocation
    assert where["a"][2] != where["c"][2]
    for n in (0, 1):
        done = json.loads(files.done(n).read_text())
        assert done["mode"] == "srun" and done["error"] is None
        assert (files.logs(n) / "rank1.log").exists()  # srun's --output, per task


@pytest.mark.slurm
def test_a_kept_allocation_on_slurm_takes_the_second_batch_and_ends(slurm_cluster, tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=256", *TINY, "search.early_stop=false", "search.repeats=2",
            "executor=slurm", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert {x["status"] for x in got} == {"ok"} and len(got) == 4
    assert len({x["job_id"] for x in got}) == 1
    assert sorted(s for s, _, _ in sets_of(res).values()) == [0, 0, 1, 1]
    (pool,) = (res / "trials").glob("*.pool")
    assert (pool / "end").exists()
    result = next((res / "jobs").glob("*/*_0_result.pkl"))  # the driver returned: job over
    assert result.exists()


def test_the_pool_payload_unpickles_and_runs_without_orchestrator_libraries(tmp_path):
    """The driver and the ranks it forks import nothing of the orchestrator (hydra, optuna,
    pandas, rich, engine modules): what the sweep pickles for a kept allocation."""
    from helpers import payload_spec, run_pickled_payload

    from hcp_tune.engine.sweep import pool_payload as pickled  # what the sweep hands submitit

    assert pickled.__module__.startswith("hcp_tune.job.")
    spec = dataclasses.replace(payload_spec(1, 1, "pool-one-rank"), device="cpu",
                               result_path=str(tmp_path / "pool-one-rank.result.json"))
    root = tmp_path / "pool"
    root.mkdir()
    PoolFiles(root).end.touch()  # no batch after the first
    proc = run_pickled_payload(tmp_path, pickled, [spec], str(root), None, True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "payload ran: ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert json.loads(PoolFiles(root).done(0).read_text())["mode"] == "fork"
