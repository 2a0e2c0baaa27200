"""What `recommend` (and the sweep's table) says of a key's verdict: each verdict's measured
error rate, and for an unsettled key a command that measures only the undecided layouts
and that the sweep accepts as it is (issue 28)."""
import shlex

import pytest

from hcp_tune import config
from hcp_tune.stats import verdict
from hcp_tune.store import tables
from hcp_tune.engine.error_rates import SETTLED_ERROR, rate_for
from hcp_tune.outputs import recommend


def rows(a2a, medians, cp=4):
    return [{"a2a": a2a, "p2p": cp // a2a, "status": "ok", "verified": True, "median_s": m,
             "peak_mem_bytes": 0, "comm_type": "a2a"} for m in medians]


def rec_of(v, **key):
    """The recommendation fields a verdict writes (tables.py), on a key."""
    base = {"cluster": "local", "model": "tiny", "tp": 1, "pp": 1, "cp": 4, "seq": 2048,
            "runner": "attention", "env_tag": "default", "dp": 1, "mbs": 1,
            "micro_batches": 1, **key}
    best = v.best
    return {**base, "a2a": best.layout[0], "p2p": best.layout[1], "verdict": v.kind,
            "n_trials": best.n_trials, "undecided": " ".join(
                f"[{a},{p}]" for a, p in v.undecided),
            "more_trials": max(v.more_trials.values()) if v.more_trials else None}


def command_args(line):
    """The overrides of a printed `python -m hcp_tune sweep ...` command."""
    words = shlex.split(line.strip())
    assert words[:4] == ["python", "-m", "hcp_tune", "sweep"]
    return words[4:]


def test_an_unsettled_command_is_one_the_sweep_accepts_and_names_the_folder_and_key(tmp_path):
    v = verdict.decide(rows(1, [1.00, 1.05, 0.97]) + rows(2, [1.02, 0.99, 1.06])
                       + rows(4, [2.0, 2.1, 2.05]))
    assert v.kind == "unsettled"
    rec = rec_of(v, dp=2, mbs=2, micro_batches=4, env_tag="te-2.9")
    first, command = recommend.verdict_lines(rec, str(tmp_path / "res"))
    assert first.startswith("unsettled: ") and rate_for("unsettled") in first
    args = command_args(command)
    assert f"results_dir={tmp_path / 'res'}" in args and "env_tag=te-2.9" in args
    assert {"dp=2", "mbs=2", "gbs=16", "search.adaptive=false"} <= set(args)
    assert "search.a2a_sizes=[1,2]" in args  # the undecided only; [4,1] is out
    cfg = config.load(args)  # what a user pastes runs
    assert (cfg.dp, cfg.mbs, cfg.search.adaptive) == (2, 2, False)
    assert cfg.search.repeats == min(rec["n_trials"] + rec["more_trials"], 100)


def test_a_near_tie_past_what_one_sweep_measures_says_so_and_its_command_still_runs():
    """1% apart at 5% spread: the power calculation asks for hundreds of trials, above the
    100 that search.repeats allows."""
    v = verdict.decide(rows(1, [1.00, 1.06, 0.95, 1.03, 0.98])
                       + rows(2, [1.01, 1.07, 0.96, 1.04, 0.99]), tie_threshold=0.001)
    rec = rec_of(v)
    assert rec["n_trials"] + rec["more_trials"] > 100
    first, command = recommend.verdict_lines(rec)
    assert "more than one sweep measures (search.repeats <= 100)" in first
    args = command_args(command)
    assert "search.repeats=100" in args and not any(a.startswith("results_dir=") for a in args)
    assert config.load(args).search.repeats == 100


def test_one_measured_layout_is_unsettled_with_nothing_to_measure_again():
    v = verdict.decide(rows(2, [1.0, 1.1, 1.05]))
    assert v.kind == "unsettled" and v.undecided == [] and v.more_trials == {}
    assert "only [2,2] has a usable measurement" in verdict.summary(v)
    (line,) = recommend.verdict_lines(rec_of(v))
    assert "nothing was compared" in line and "python -m" not in line


def test_the_sweep_states_each_verdicts_error_rate_once_and_the_unsettled_commands():
    settled = rec_of(verdict.decide(rows(1, [1.0, 1.01, 0.99]) + rows(2, [1.5, 1.52, 1.49])))
    open_key = rec_of(verdict.decide(rows(1, [1.00, 1.05, 0.97]) + rows(2, [1.02, 0.99, 1.06])),
                      seq=4096)
    again = {**settled, "seq": 8192}
    lines = recommend.sweep_verdict_lines([settled, open_key, again], "/r")
    assert lines[0] == f"settled: {SETTLED_ERROR}"
    assert sum(SETTLED_ERROR in ln for ln in lines) == 1
    assert lines[1].startswith("tp=1 seq=4096: unsettled: ")
    assert "results_dir=/r" in lines[2]


@pytest.mark.parametrize("median", [float("inf"), float("nan"), 0.0, -1.0, "1.0"])
def test_a_trial_without_a_finite_positive_median_enters_no_figure(median):
    bad = rows(2, [median])
    assert not verdict.usable(bad[0])
    (fig,) = verdict.figures(rows(2, [1.0, 1.1, 1.2]) + bad)
    assert fig.n_trials == 3 and fig.ci_lo_s == fig.ci_lo_s  # no NaN interval


def test_tables_write_what_the_verdict_lines_read():
    """rec_of above mirrors tables.py: the field names it writes."""
    import inspect
    src = inspect.getsource(tables)
    assert "undecided=" in src and "more_trials=max(v.more_trials.values())" in src
