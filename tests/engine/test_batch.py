"""Batches: several trials in one job's processes (``executor.trials_per_job``), each
result landing the moment its trial ends; a broken batch's unrun trials rerun in new
processes (a new process set of the kept allocation: nothing lost, nothing twice), also
across a SIGKILL of the orchestrator; early stop and
Ctrl-C reach a trial inside a batch; a job ended from outside is ``cancelled`` and measured
again; the local and SLURM executors store the same statuses and fields."""
import json
import subprocess
import sys

import pytest
from helpers import (
    ENV,
    REPO,
    TINY,
    ctrl_c_once_submitted,
    hcp,
    journal_text,
    kill_after_first_row_and_resume,
    make_spec,
    per_layout,
    result_file,
    rows,
    squeue_ids,
    start,
    wait_for,
)

from hcp_tune.space.layout import Layout
from hcp_tune.spec import Status

BATCH = [*TINY, "search.early_stop=false", "executor.trials_per_job=6"]


@pytest.mark.multiproc
def test_batch_reuses_groups_and_proof_within_a_layout(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=[256,512]", *BATCH, "executor=local", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(s, a): 1 for s in (256, 512) for a in (1, 2)}
    assert {x["status"] for x in got} == {"ok"} and all(x["verified"] for x in got)
    assert len({x["job_id"] for x in got}) == 1  # one job ran all four
    for a2a in (1, 2):
        first, second = sorted((x for x in got if x["a2a"] == a2a), key=lambda x: x["seq"])
        r1, r2 = result_file(res, first), result_file(res, second)
        assert "reused" not in r1.verification["numerics"]  # proven with its real groups
        assert r2.verification["numerics"]["reused"] and r2.verification["groups"]["match"]
        assert "groups reused from the previous trial in the same processes" in r2.notes


def _process_set(res, row) -> tuple[str, str]:
    """(job, rank 0's pid) of the processes that ran a stored trial (``job.pool``'s note)."""
    (note,) = [n for n in result_file(res, row).notes if "process set" in n]
    return row["job_id"], note.rsplit("pid ", 1)[1]


@pytest.mark.multiproc
def test_middle_trial_crashing_its_processes_reruns_the_rest_in_new_processes(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=[256,512,1024]", *BATCH,
            "executor=local", f"results_dir={res}", fault="kill_rank@512")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(s, a): 1 for s in (256, 512, 1024) for a in (1, 2)}  # once
    failed = [x for x in got if x["status"] == "failed"]
    assert {(x["seq"], x["failure_class"]) for x in failed} == {(512, "comm")}
    assert {x["status"] for x in got if x["seq"] != 512} == {"ok"}
    assert len({x["job_id"] for x in got}) == 1  # the allocation was kept (keep_allocation)
    assert len({_process_set(res, x) for x in got}) == 3  # each crash: new processes


@pytest.mark.multiproc
def test_stop_file_prunes_a_trial_and_the_batch_goes_on(tmp_path):
    """What early stop and Ctrl-C use: the job checks a trial's stop file before every step."""
    from hcp_tune.engine.launch import run_local_batch

    stop = tmp_path / "first.stop"
    stop.write_text("stopped early: slower than the best")
    specs = [make_spec(Layout(1, 2), trial_id="first", stop_path=str(stop)),
             make_spec(Layout(1, 2), trial_id="second", stop_path=str(tmp_path / "none.stop"))]
    first, second = run_local_batch(specs, workdir=tmp_path / "w")
    assert first.status == Status.PRUNED and first.error == "stopped early: slower than the best"
    assert second.status == Status.OK  # the processes stayed usable


@pytest.mark.slurm
@pytest.mark.parametrize("mode, seqs", [pytest.param("processes", (256, 512, 1024), id="processes"),
                                         pytest.param("steps", (256, 512), id="steps")])
def test_killed_orchestrator_mid_batch_resumes_without_losing_or_rerunning(
        slurm_cluster, tmp_path, mode, seqs):
    """Both batch modes (one set of processes; srun job steps in one allocation). Steps
    start fresh processes per trial, so two sequence lengths leave plenty to resume."""
    res = tmp_path / "results"
    args = ["sweep", "cp=2", f"seq=[{','.join(map(str, seqs))}]", *BATCH,
            f"executor.batch={mode}", "executor=slurm", f"results_dir={res}"]
    first, after, out = kill_after_first_row_and_resume(res, args)
    assert len(first) < 2 * len(seqs), "the batch ended before the kill: nothing to resume"
    assert "re-attached by job id" in out
    assert per_layout(after.values()) == {(s, a): 1 for s in seqs for a in (1, 2)}
    assert {x["status"] for x in after.values()} == {"ok"}
    if mode == "steps":
        assert len({x["job_id"] for x in after.values()}) == 1  # the resumed run re-attached it


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["processes", "steps"])
def test_ctrl_c_reaches_the_trials_of_a_running_batch(slurm_cluster, tmp_path, mode):
    res = tmp_path / "results"
    got, _ = ctrl_c_once_submitted(res, "cp=2", "seq=[256,512]", "search.early_stop=false",
                                   "executor.trials_per_job=6", f"executor.batch={mode}")
    assert len(got) == 4 and {x["status"] for x in got} == {"cancelled"}
    ids = {x["job_id"] for x in got}
    if mode == "steps":
        assert len(ids) == 1
    wait_for(lambda: not (ids & squeue_ids()), timeout_s=60, what="the jobs to leave squeue")
    assert not list((res / "trials").glob("*.stop"))  # Ctrl-C leaves no stop file behind


@pytest.mark.slurm
def test_job_cancelled_from_outside_is_cancelled_and_measured_again(slurm_cluster, tmp_path):
    res = tmp_path / "results"
    args = ["sweep", "cp=2", "seq=256", *BATCH, "executor=slurm", f"results_dir={res}"]
    proc = start(*args[:-2], "runner.measure_steps=100000", *args[-2:])
    progress = res / "progress"
    wait_for(lambda: progress.exists() and any(p.stat().st_size for p in progress.glob("*.jsonl")),
             what="a trial measuring")
    job_ids = {json.loads(line).get("user_attr", {}).get("job_id")
               for line in journal_text(res).splitlines() if "job_id" in line}
    job_ids.discard(None)
    assert job_ids
    subprocess.run(["scancel", *job_ids], check=True)  # as an administrator or preemption
    out, _ = proc.communicate(timeout=180)
    got = rows(res)
    assert len(got) == 2 and {x["status"] for x in got} == {"cancelled"}, out
    assert all("ended from outside" in x["error"] for x in got)
    r = hcp(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 trial(s) to run" in r.stdout
    ok = [x for x in rows(res) if x["status"] == "ok"]
    assert sorted(x["a2a"] for x in ok) == [1, 2]


@pytest.mark.slurm
def test_local_and_slurm_executors_store_the_same_statuses_and_fields(slurm_cluster, tmp_path):
    got = {}
    for name in ("local", "slurm"):
        res = tmp_path / name
        r = hcp("sweep", "cp=2", "seq=[256,512]", *BATCH,
                f"executor={name}", f"results_dir={res}", fault="cp_off@512")
        assert r.returncode == 0, r.stdout + r.stderr
        got[name] = rows(res)

    def shape(rows_):
        return sorted((x["seq"], x["a2a"], x["status"], x["failure_class"], x["verified"],
                       x["steps"], bool(x["log_path"]), bool(x["job_id"]), sorted(x))
                      for x in rows_)

    assert shape(got["local"]) == shape(got["slurm"])


@pytest.mark.multiproc
def test_budget_stops_submitting_and_says_so(tmp_path):
    """Each tiny cp=2 trial is estimated at 2 ranks x (steps + 30 s start-up) ~ 0.0167
    rank-hours with a job each: a budget of 0.02 lets one go out, not two."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=256", *TINY, "search.early_stop=false", "executor=local",
            "executor.trials_per_job=1", "search.budget_gpu_hours=0.02", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sweep: 2 trial(s) to run; estimate: 2 trial(s)," in r.stdout
    assert ("sweep: search.budget_gpu_hours=0.02: stopped submitting at an estimated 0.0167 "
            "GPU-hours submitted (the next trial would add 0.0167); 1 trial(s) not run: raise "
            "the budget and run the same command again to resume") in r.stderr
    assert len(rows(res)) == 1


def test_plan_states_the_cost_as_an_estimate():
    r = hcp("plan", "cp=2", "seq=256", "model=tiny", "cluster=local", "format=json")
    est = json.loads(r.stdout)["estimate"]
    # two layouts, search.min_repeats=1 each: what the adaptive default plans first
    assert est["trials"] == 2 and est["label"] == "estimate" and est["gpu_hours"] > 0
    assert est["text"].startswith("estimate: 2 trial(s), ")


def test_a_peers_root_cause_is_merged_once_for_either_executor(tmp_path):
    """The one merge (hcp_tune.merge.merge_root_cause) that the local launcher and the
    orchestrator's reading of any executor's result file both go through."""
    from hcp_tune.engine.trials import read_result
    from hcp_tune.merge import rank_out_path
    from hcp_tune.spec import FailureClass, TrialResult, to_json

    out = tmp_path / "t.result.json"
    lost = TrialResult(trial_id="t", status=Status.FAILED, failure_class=FailureClass.COMM,
                       error="DistBackendError: Connection closed by peer")
    own = TrialResult(trial_id="t", status=Status.FAILED, failure_class=FailureClass.OOM,
                      error="OutOfMemoryError: CUDA out of memory")
    out.write_text(to_json(lost))
    rank_out_path(out, 1).write_text(to_json(lost))
    rank_out_path(out, 2).write_text(to_json(own))
    spec = make_spec(Layout(1, 4), trial_id="t", result_path=str(out))
    expected = ("DistBackendError: Connection closed by peer "
                "(cause: oom: OutOfMemoryError: CUDA out of memory)")
    assert read_result(spec).error == expected
    out.write_text(to_json(read_result(spec)))  # as the launcher rewrites it
    assert read_result(spec).error == expected  # merged once, not twice


def test_recommend_names_the_layouts_a_key_is_missing(tmp_path):
    from helpers import BARE_KEY as KEY
    from helpers import bare_row as row

    from hcp_tune.store.folder import ResultStore, SweepKey

    store = ResultStore(tmp_path)
    for r in (row(1, "ok", 0.1), row(2, "cancelled")):
        store.add(r, SweepKey(**KEY))
    store.rebuild()
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=2", "seq=256",
            f"results_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert ("incomplete: not every layout has a valid measurement: [2,1] cancelled; run the "
            "same sweep again to measure them") in " ".join(r.stdout.split())  # wrapped at 100


@pytest.mark.multiproc
def test_early_stop_prunes_a_planted_slow_trial_inside_a_batch_and_the_batch_goes_on(tmp_path):
    """The orchestrator's own ``should_prune`` writes the stop file. [1,2] (the ring, first
    in candidate order) is planted slow: 0.2 s before each ring transfer, 10x or more a tiny
    seq-256 step. Batch 1 measures it in full (no best yet), then [2,1]; batch 2 (the
    repeats, new processes) starts [1,2] with a best to beat: it is stopped after 3 of its
    15 steps (7 s or more left to notice), and [2,1] after it in the same processes still
    completes."""
    res = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", "cp=2", "seq=256", *TINY,
         "runner.measure_steps=15", "search.early_stop=true", "search.order_by_prediction=false",
         "search.repeats=2", "search.adaptive=false", "executor.trials_per_job=6",
         "executor=local",
         f"results_dir={res}"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**ENV, "HCP_TUNE_INJECT_DELAY": "p2p:0.2"})
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert per_layout(got) == {(256, 1): 2, (256, 2): 2}
    pruned = [x for x in got if x["status"] == "pruned"]
    assert [x["a2a"] for x in pruned] == [1], [(x["a2a"], x["status"]) for x in got]
    slow = pruned[0]
    assert 3 <= slow["steps"] < 15 and slow["error"].startswith("stopped early: fastest of")
    stop = res / "trials" / f"{slow['trial_id']}.stop"
    assert stop.read_text() == slow["error"]  # written by the orchestrator, read by the job
    same = [x for x in got
            if _process_set(res, x) == _process_set(res, slow) and x is not slow]
    assert [(x["a2a"], x["status"], x["steps"]) for x in same] == [(2, "ok", 15)]


def test_an_adaptive_plan_states_the_most_its_rounds_can_cost():
    """The adaptive default plans one trial a layout; the plan also says what the rounds
    for undecided layouts can add at most (search.repeats each), and what adaptive
    measured of an exhaustive sweep on the decision-cost benchmark's held-out keys."""
    from hcp_tune.engine.error_rates import ADAPTIVE_COST
    r = hcp("plan", "cp=2", "seq=256", "model=tiny", "cluster=local", "format=json")
    est = json.loads(r.stdout)["estimate"]
    assert est["trials"] == 2 and est["max_trials"] == 10
    assert est["max_gpu_hours"] > est["gpu_hours"]
    assert "up to 10 trial(s) in all" in est["text"] and ADAPTIVE_COST in est["text"]
    r = hcp("plan", "cp=2", "seq=256", "model=tiny", "cluster=local", "format=json",
            "search.adaptive=false")
    est = json.loads(r.stdout)["estimate"]
    assert est["trials"] == 10 and "max_trials" not in est
