"""`sweep` end to end through the real local SLURM cluster (and the local executor):
measured rows, ranking, recommendation, failed trials. Resume after SIGKILL and Ctrl-C of
a sweep are in test_batch.py (a sweep's trials of one world size run as one batch)."""
import csv
import io
import json

import pandas as pd
import pytest

from hcp_tune.engine import dispatch
from helpers import (
    TINY,
    hcp,
    result_file,
    rows,
    squeue_ids,
)


@pytest.mark.slurm
def test_sweep_measures_ranks_and_recommends(slurm_cluster, tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=4", "seq=[2048,4096]", *TINY, "executor=slurm", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert sorted((x["seq"], x["a2a"], x["p2p"]) for x in got) == [
        (s, a, 4 // a) for s in (2048, 4096) for a in (1, 2, 4)]
    assert {x["status"] for x in got} == {"ok"}, [x["error"] for x in got]
    assert all(x["verified"] for x in got)
    assert all(x["job_id"] and x["steps"] == 3 for x in got)
    recs = pd.read_csv(res / "recommendations.csv")
    assert sorted(recs["seq"]) == [2048, 4096]
    for rec in recs.to_dict("records"):
        key_rows = [x for x in got if x["seq"] == rec["seq"]]
        fastest = min(key_rows, key=lambda x: x["median_s"])
        assert (rec["a2a"], rec["p2p"]) == (fastest["a2a"], fastest["p2p"])
        assert rec["trials"] == 3
    assert "ranked:" in r.stdout
    # recommend answers from what was stored
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=4", "seq=2048", f"results_dir={res}",
            "format=json")
    assert r.returncode == 0, r.stderr
    ans = json.loads(r.stdout)
    assert ans["found"] and ans["bridge_overrides"][0] == "model.context_parallel_size=4"
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=4", "seq=8192", f"results_dir={res}")
    assert r.returncode == 3
    assert "nothing measured for" in r.stdout and "seq=2048" in r.stdout
    # with no key: the cluster's whole table, one line per measured key (issue 31)
    r = hcp("recommend", "cluster=local", "model=tiny", f"results_dir={res}", "format=csv")
    assert r.returncode == 0, r.stderr
    listed = list(csv.DictReader(io.StringIO(r.stdout)))
    assert sorted(int(x["seq"]) for x in listed) == [2048, 4096]
    # running it again measures nothing new
    r = hcp("sweep", "cp=4", "seq=[2048,4096]", *TINY, "executor=slurm", f"results_dir={res}")
    assert r.returncode == 0 and "0 trial(s) to run" in r.stdout
    assert len(rows(res)) == 6


@pytest.mark.slurm
def test_failing_trial_is_recorded_with_its_class_and_the_sweep_completes(slurm_cluster, tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=slurm",
            f"results_dir={res}", fault="raise")
    assert r.returncode == 1, r.stdout + r.stderr  # nothing was measured
    assert "sweep: nothing measured: 2 trial(s) failed or were invalid (unknown: 2)" in r.stderr
    got = rows(res)
    assert len(got) == 2 and {x["status"] for x in got} == {"failed"}
    assert all(x["failure_class"] and x["error"] for x in got)
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=2", "seq=1024", f"results_dir={res}")
    assert r.returncode == 3


def test_sweep_through_the_local_executor(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=local", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert sorted((x["a2a"], x["status"]) for x in got) == [(1, "ok"), (2, "ok")]
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=2", "seq=1024", f"results_dir={res}")
    assert r.returncode == 0 and "model.cp_comm_type=" in r.stdout


def test_sweep_with_data_parallel_replicas_measures(tmp_path):
    # issue 19: the plan expects every replica's CP groups ([0,1] and [2,3]); the job used to
    # start tp*cp = 2 ranks and every trial came back invalid ("cp groups differ")
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "dp=2", "seq=1024", *TINY, "executor=local", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert sorted((x["a2a"], x["status"]) for x in got) == [(1, "ok"), (2, "ok")], got
    assert all(x["verified"] for x in got)
    assert {result_file(res, x).world_size for x in got} == {4}  # tp*cp*dp ranks ran


def test_planted_cp_off_is_never_ranked(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=local",
            f"results_dir={res}", fault="cp_off")
    assert r.returncode == 1, r.stdout + r.stderr  # nothing proved CP active: nothing measured
    assert "nothing measured: 2 trial(s) failed or were invalid (invalid: 2)" in r.stderr
    got = rows(res)  # both layouts ran in one job (a batch of processes, trials_per_job=auto)
    assert len({x["job_id"] for x in got}) == 1
    assert {(x["status"], x["failure_class"]) for x in got} == {("invalid", "numerics")}
    assert not [x for x in got if x["median_s"]]
    r = hcp("recommend", "cluster=local", "model=tiny", "cp=2", "seq=1024", f"results_dir={res}")
    assert r.returncode == 3


def test_environment_failure_stops_the_sweep_and_says_how_to_resume(tmp_path):
    res = tmp_path / "results"
    # a GPU cluster profile on this CPU machine: every trial would fail the same way
    r = hcp("sweep", "cp=2", "seq=1024", "model=tiny", "cluster=dgx-h100", "runner=attention",
            "runner.warmup_steps=1", "runner.measure_steps=3", "executor=local",
            f"results_dir={res}")
    assert r.returncode == 1, r.stdout + r.stderr
    (row,) = rows(res)
    assert row["status"] == "failed" and row["failure_class"] == "environment"
    assert "no CUDA device on this node" in row["error"]
    assert "1 trial(s) not run" in r.stderr and "run the same command again" in r.stderr
    # run again (as after fixing the stack): the environment failure is retried, not kept
    r = hcp("sweep", "cp=2", "seq=1024", "model=tiny", "cluster=dgx-h100", "runner=attention",
            "runner.warmup_steps=1", "runner.measure_steps=3", "executor=local",
            f"results_dir={res}")
    assert "sweep: 2 trial(s) to run" in r.stdout
    assert len(rows(res)) == 2  # the first failure stays on record beside the retry


def test_layouts_predicted_too_slow_are_skipped_with_the_prediction(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=local",
            "search.skip_predicted_slower_than=1.0", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {x["status"]: x for x in rows(res)}
    assert sorted(got) == ["ok", "skipped"]  # the best predicted runs, the other is skipped
    assert "predicted" in got["skipped"]["error"] and got["skipped"]["predicted_step_s"] > 0
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=local",
            "search.skip_predicted_slower_than=1.0", f"results_dir={res}")
    assert "0 trial(s) to run" in r.stdout  # a skipped layout is not re-planned on resume


def test_recommend_without_measurements_offers_a_labelled_prediction(tmp_path):
    r = hcp("recommend", "cluster=dgx-h100", "model=llama3-8b", "cp=8", "seq=131072",
            f"results_dir={tmp_path}", "format=json")
    assert r.returncode == 3
    ans = json.loads(r.stdout)
    assert ans["found"] is False and ans["recommendation"] is None
    assert ans["prediction"]["label"].startswith("predicted")
    assert ans["prediction"]["bridge_overrides"][0] == "model.context_parallel_size=8"
    r = hcp("recommend", "cluster=dgx-h100", "model=llama3-8b", "cp=8", "seq=131072",
            f"results_dir={tmp_path}")
    assert "PREDICTED, not measured" in r.stdout


@pytest.mark.slurm
def test_runner_auto_predicts_when_the_partition_cannot_hold_a_trial(slurm_cluster, tmp_path):
    """The same trial with runner=auto: sinfo shows one node, the trial needs 4, so nothing
    is submitted; the sweep says why in one line and prints the predicted ranking."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=8", "seq=131072", "tp=4", "pp=1", "cluster=dgx-h100",
            "executor=slurm", f"results_dir={res}", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("runner=auto: SLURM here has 1 node(s) with 8 GPU(s) in the default partition; "
            "the smallest trial of cluster=dgx-h100 needs 32 ranks on 4 node(s) of 8 GPUs: "
            "predicting") in r.stderr
    assert "PREDICTED" in r.stdout and not (res / "rows").exists()


def test_partition_nodes_reads_sinfo_gres_per_partition():
    text = ("debug*|1|gpu:8|16\nbig|3|gpu:h100:8(S:0-1)|64\nbig|2|gpu:4|64\n"
            "cpu|10|(null)|128\n")
    assert dispatch.partition_nodes(text, None, 8) == 1  # the default partition
    assert dispatch.partition_nodes(text, "big", 8) == 3  # typed gres, socket suffix
    assert dispatch.partition_nodes(text, "big", 4) == 5
    assert dispatch.partition_nodes(text, "cpu", 1) == 0  # no GPUs at all
    assert dispatch.partition_nodes(text, "nope", 1) == 0


@pytest.mark.slurm
def test_a_job_slurm_can_never_start_fails_at_once_and_is_cancelled(slurm_cluster, tmp_path):
    """cp=8 tp=4 on dgx-h100 needs 4 nodes of 8 GPUs; the local cluster has one node, so
    SLURM keeps the job pending (reason PartitionConfig) forever. The sweep must not wait:
    the trial fails as an environment problem naming the reason, and the job is cancelled."""
    res = tmp_path / "results"
    r = hcp("sweep", "cp=8", "seq=131072", "tp=4", "pp=1", "cluster=dgx-h100",
            "runner=attention", "executor=slurm", f"results_dir={res}", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    out = " ".join(r.stdout.split())  # trial lines wrap at the output's width
    assert "SLURM will never start job" in out and "PartitionConfig" in out
    got = rows(res)
    assert got and {(x["status"], x["failure_class"]) for x in got} == {("failed", "environment")}
    assert not ({x["job_id"] for x in got} & squeue_ids())
