"""Commands as a new user types them: from a fresh folder (not the repo), with the defaults
(``results_dir=results``, relative; ``runner=auto``), on the local CPU profile.

Issue 8, section 4: a relative results folder (1), a sweep that measured nothing (2),
retrying stored failures (3), ``trial`` with the default runner (4).
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import rows

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
FAST = ["runner.warmup_steps=1", "runner.measure_steps=2"]
# one trial a layout (the adaptive default measures each at least 3 times: tests/helpers.py)
SWEEP = ["sweep", "cluster=local", "model=tiny", "cp=2", "seq=256", "runner=attention",
         "executor=local", *FAST, "search.repeats=1", "search.min_repeats=1"]


def hcp(cwd: Path, *args: str, timeout: int = 300, fault: str = "") -> subprocess.CompletedProcess:
    env = {**ENV, "HCP_TUNE_INJECT_FAULT": fault} if fault else ENV
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


def csv_table(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_local_sweep_with_the_default_relative_results_dir(tmp_path):
    """Issue 8 §4.1: every trial failed (the ranks run in the trial's folder, where
    ``results/progress/...`` does not exist)."""
    user = tmp_path / "fresh"
    user.mkdir()
    r = hcp(user, *SWEEP)
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(user / "results")
    assert sorted((x["a2a"], x["status"]) for x in got) == [(1, "ok"), (2, "ok")], \
        [x["error"] for x in got]
    header, table = csv_table(user / "results" / "trials.csv")
    assert len(table) == 2 and {t["status"] for t in table} == {"ok"}

    # recommend, from the same folder, answers from what the sweep stored there
    r = hcp(user, "recommend", "cluster=local", "model=tiny", "cp=2", "seq=256")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model.context_parallel_size=2" in r.stdout


def test_readme_trial_with_the_default_runner_from_a_fresh_folder(tmp_path):
    """Issue 8 §4.4: the README's ``trial`` (runner=auto by default) failed with "runner
    'auto' is not implemented in this job yet". ``trial`` always measures: auto is attention."""
    r = hcp(tmp_path, "trial", "cp=2", "seq=256", "model=tiny", "cluster=local", "a2a=2", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    assert result["status"] == "ok", result.get("error")
    assert Path(result["log_path"]).is_relative_to(tmp_path / "results")


def test_trial_refuses_runner_model_in_one_line(tmp_path):
    r = hcp(tmp_path, "trial", "cp=2", "seq=256", "model=tiny", "cluster=local", "a2a=2",
            "runner=model")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "hcp-tune: error: runner=model: trial measures one layout and runner=model only "
        "predicts; use runner=attention (or auto), or `python -m hcp_tune predict ...` to predict"]
    assert not (tmp_path / "results").exists()


def test_a_sweep_that_measured_nothing_exits_1_and_stored_failures_can_be_retried(tmp_path):
    """Issue 8 §4.2 and §4.3: the sweep exited 0 with a header-less recommendations.csv, and
    running it again after the fix did nothing ("resumed: 2 already stored")."""
    r = hcp(tmp_path, *SWEEP, fault="raise")  # every trial raises
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("sweep: nothing measured: 2 trial(s) failed or were invalid (unknown: 2); "
            f"errors in {tmp_path / 'results' / 'trials.csv'}") in r.stderr
    header, table = csv_table(tmp_path / "results" / "trials.csv")
    assert [t["failure_class"] for t in table] == ["unknown", "unknown"]
    header, table = csv_table(tmp_path / "results" / "recommendations.csv")
    assert header[:8] == ["cluster", "model", "tp", "pp", "cp", "seq", "runner", "env_tag"]
    assert table == []

    # the same command again: nothing to run, and the message names the option
    r = hcp(tmp_path, *SWEEP, fault="raise")
    assert r.returncode == 1
    assert "0 trial(s) to run; resumed: 2 already stored" in r.stdout
    assert "search.retry=failed" in r.stdout and "search.retry=failed" in r.stderr

    # the cause fixed; a class that did not occur retries nothing
    r = hcp(tmp_path, *SWEEP, "search.retry=[oom,comm]")
    assert r.returncode == 1 and "0 trial(s) to run" in r.stdout

    # a bad value: one line naming the allowed values, exit 2, nothing run
    r = hcp(tmp_path, *SWEEP, "search.retry=bogus")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "hcp-tune: error: search.retry='bogus': expected one of none, failed, oom, comm, "
        "numerics, environment, config, time_limit, unknown, invalid, or a list of them"]

    r = hcp(tmp_path, *SWEEP, "search.retry=failed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "measuring 2 stored failure(s) again (search.retry=failed)" in r.stdout
    got = rows(tmp_path / "results")
    assert sorted((x["a2a"], x["status"]) for x in got) == [
        (1, "failed"), (1, "ok"), (2, "failed"), (2, "ok")]  # the failures stay on record
    header, table = csv_table(tmp_path / "results" / "recommendations.csv")
    assert len(table) == 1

    # measured now: retrying failures again re-measures nothing
    r = hcp(tmp_path, *SWEEP, "search.retry=failed")
    assert r.returncode == 0 and "0 trial(s) to run" in r.stdout


def test_keys_left_without_a_measurement_are_named_when_others_were_measured():
    from hcp_tune.store.folder import SweepKey
    from hcp_tune.engine.sweep import SweepSummary
    from hcp_tune.outputs.ui import unmeasured_lines as _unmeasured_lines

    k1, k2 = (SweepKey("local", "tiny", 1, 2, seq, "attention", "default") for seq in (256, 512))
    summary = SweepSummary(keys=[k1, k2], failures={k2: {"oom": 1}},
                           kept_failures={k2: {"oom": 1}})
    assert _unmeasured_lines(summary, {(1, 256)}, "t.csv") == [
        "sweep: nothing measured for tp=1 seq=512: 2 trial(s) failed or were invalid (oom: 2)",
        "sweep: 1 failed or invalid trial(s) stored by an earlier run are kept: after fixing "
        "the cause, search.retry=failed (or a class, e.g. search.retry=oom) measures them again"]
    assert _unmeasured_lines(summary, {(1, 256), (1, 512)}, "t.csv") == []
    assert _unmeasured_lines(SweepSummary(), set(), "t.csv") == [
        "sweep: nothing measured: no layout of this sweep is kept (see `python -m hcp_tune "
        "plan` with the same overrides for the reasons)"]
