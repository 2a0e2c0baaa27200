"""Failures are results: the planted silent CP-off, missing HCP groups, a raised error, a
rank lost mid-trial, a hung rank, the job's time limit and the wait's backstop. The
multi-process ones run the sweep's local path (``launch.run_local``: the job payload under
submitit's LocalExecutor, one task per rank)."""
import time
from pathlib import Path

import pytest
from helpers import make_spec

from hcp_tune.engine.launch import run_local
from hcp_tune.merge import merge_root_cause, rank_out_path
from hcp_tune.space.layout import Layout
from hcp_tune.spec import FailureClass, Status, TrialResult, to_json


def _planted(batch, fault):
    return batch("world4")[f"tiny-tp1-cp4-2x2-{fault}"][1]


@pytest.mark.multiproc
def test_planted_cp_off_is_caught_as_invalid_numerics(batch):
    res = _planted(batch, "cp_off")
    assert res.status == Status.INVALID and res.failure_class == FailureClass.NUMERICS
    assert res.error.startswith("CP result differs from single-process attention")
    assert res.verification["groups"]["match"]  # the groups were right: only the proof catches it
    assert min(res.verification["numerics"]["errors"].values()) > 1e-2
    assert res.step_times_s == [] and res.tflops_per_gpu is None  # never timed, never ranked


@pytest.mark.multiproc
def test_missing_hcp_groups_make_the_trial_invalid(batch):
    """Also after an earlier trial in the same processes created HCP groups (stale state)."""
    res = _planted(batch, "no_groups")
    assert res.status == Status.INVALID
    assert res.error.startswith(
        "a2a groups missing on ranks [0, 1, 2, 3]: the HCP groups were never created")
    assert res.verification["groups"]["actual"]["a2a"] is None
    assert "numerics" not in res.verification


@pytest.mark.multiproc
def test_raised_error_is_failed_with_its_first_line(batch):
    res = _planted(batch, "raise")
    assert res.status == Status.FAILED and res.failure_class == FailureClass.UNKNOWN
    assert res.error == "RuntimeError: injected fault (tests only): raise"
    assert res.log_path.endswith("_0_log.err")  # rank 0's log in the job's folder


@pytest.mark.multiproc
def test_trials_after_a_failure_in_the_same_processes_are_skipped(batch):
    res = batch("world4")["after-raise"][1]
    assert res.status == Status.SKIPPED
    assert res.error == "not run: trial tiny-tp1-cp4-2x2-raise failed before it in the same processes"


@pytest.mark.multiproc
def test_job_time_limit_stops_all_ranks_together(batch):
    res = batch("world2")["time-limit"][1]
    assert res.status == Status.FAILED and res.failure_class == FailureClass.TIME_LIMIT
    assert res.error == "TimeLimitReached: time limit reached after 0 of 3 steps"


@pytest.mark.multiproc
def test_rank_killed_mid_trial_ends_as_comm_failure(tmp_path):
    spec = make_spec(Layout(1, 2), inject_fault="kill_rank", comm_timeout_s=20.0)
    res = run_local(spec, workdir=tmp_path, timeout_s=180)  # the backstop, far above 20 s
    assert res.status == Status.FAILED and res.failure_class == FailureClass.COMM, res.error
    assert res.error.endswith("(cause: ranks [1] wrote no result; see their logs)"), res.error
    assert "numerics" in res.verification  # it died after the proof, in the timed steps


def test_backstop_cancels_the_job_past_its_limit(tmp_path):
    spec = make_spec(Layout(1, 2))
    res = run_local(spec, workdir=tmp_path, timeout_s=0.5)  # shorter than interpreter start-up
    assert res.status == Status.FAILED and res.failure_class == FailureClass.TIME_LIMIT
    assert res.error.startswith("time limit: 0s passed before the trial ended; cancelled job ")
    assert " and its 2 processes (see " in res.error


@pytest.mark.multiproc
def test_hung_rank_ends_the_others_by_the_comm_timeout(tmp_path):
    """A peer that stops answering (no socket closes) is caught by the process-group timeout."""
    spec = make_spec(Layout(1, 2), inject_fault="hang_rank", comm_timeout_s=5.0)
    res = run_local(spec, workdir=tmp_path, timeout_s=180)  # the backstop, far above 5 s
    assert res.status == Status.FAILED and res.failure_class == FailureClass.COMM, res.error
    assert "timed out" in res.error.lower() or "timeout" in res.error.lower(), res.error
    # the hung rank ends itself once rank 0's task has ended (no executor kills it sooner)
    peer_log = Path(res.log_path.replace("_0_log.err", "_1_log.err"))
    deadline = time.monotonic() + 120
    while "after rank 0's task ended: exiting" not in peer_log.read_text():
        assert time.monotonic() < deadline, peer_log.read_text()[-2000:]
        time.sleep(0.5)


def _failed(error, cls=FailureClass.COMM):
    return TrialResult(trial_id="t", status=Status.FAILED, failure_class=cls, error=error)


def test_root_cause_names_silent_ranks_when_no_peer_has_its_own(tmp_path):
    out = tmp_path / "t.result.json"
    out.write_text(to_json(_failed("DistBackendError: Connection closed by peer")))
    rank_out_path(out, 2).write_text(to_json(_failed("DistBackendError: timed out")))
    res = merge_root_cause(_failed("DistBackendError: Connection closed by peer"), out, 4)
    assert res.error == ("DistBackendError: Connection closed by peer "
                         "(cause: ranks [1, 3] wrote no result; see their logs)")
    assert merge_root_cause(res, out, 4).error == res.error  # once


def test_the_executors_time_limit_signal_is_a_time_limit_failure():
    """Both executors signal rank 0 before their limit; submitit raises this in the trial."""
    from submitit.core.utils import UncompletedJobError

    from hcp_tune.job.failures import classify

    cls, line = classify(UncompletedJobError(
        "Job not requeued because: timed-out and not checkpointable."))
    assert cls == FailureClass.TIME_LIMIT
    assert line.startswith("time limit: executor.time_limit_min is about to pass (")
