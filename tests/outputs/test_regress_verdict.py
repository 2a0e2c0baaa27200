"""``regress``'s evidence rules on recorded rows: a verdict only from the whole interval,
inconclusive layouts with the trials and the sweep that settle them, memory judged only on
per-trial device readings, the exit codes 0 / 1 / 4, and ``settle=true`` (with recorded
sweeps standing in for the real ones)."""
import pytest
from helpers import CPU_MEM, CUDA_MEM, FP, pool_rows, retag, rows_for

from hcp_tune.outputs.regress import Options, RegressError, compare
from hcp_tune.outputs.regress_settle import settle, settle_plan, sweep_command
from hcp_tune.outputs.regress_verdict import memory_not_measured, trials_to_settle, verdict
from hcp_tune.outputs.regress_view import next_steps, summary_line, verdict_text

OPTS = Options(baseline="old", candidate="new")
KEY = ("local", "tiny", 1, 1, 4, 4096, "attention", 1, 1, 1)  # regress.COMPARED: dp, mbs, m last


@pytest.mark.parametrize("lo,hi,expected", [
    (1.06, 1.30, "regression"),    # the whole interval above 1 + 0.05
    (1.05, 1.30, "inconclusive"),  # touching the edge is not beyond it
    (0.70, 0.94, "improvement"),
    (0.70, 0.95, "inconclusive"),
    (0.95, 1.05, "ok"),            # inside, edges included
    (0.94, 1.02, "inconclusive"),
    (0.90, 1.10, "inconclusive"),  # straddles both edges
])
def test_verdict_needs_the_whole_interval_on_one_side(lo, hi, expected):
    assert verdict(lo, hi, 0.05) == expected


def test_the_issues_a_a_layout_is_inconclusive_not_a_regression():
    # issue 23's [2,1] row on identical code: ratio 1.33, interval 0.80-1.56, noise 15.6%.
    # The point ratio is past max(threshold, noise floor), so the old rule said REGRESSION.
    base, cand = [0.139, 0.1387, 0.1911], [0.1911, 0.139, 0.1842]
    rep = compare(rows_for("old", 2, 1, base, mem_note=CPU_MEM)
                  + rows_for("new", 2, 1, cand, mem=(1 << 30) * 113 // 100, mem_note=CPU_MEM),
                  OPTS)
    (c,) = rep.comparisons
    assert c.ratio - 1 > c.bound  # what the old rule flagged
    assert c.ci[0] < 1 < c.ci[1]
    assert c.verdict == "inconclusive" and not c.flagged
    assert c.mem_verdict == "n/a"  # CPU: the process's peak-RSS growth is no measurement
    assert rep.exit_code == 4
    assert summary_line(rep).startswith("regress old -> new: no confirmed change in 1 "
                                        "key/layout(s); 1 inconclusive (measure more)")


def test_an_inconclusive_layout_says_how_many_trials_and_which_sweep_settle_it():
    rows = rows_for("old", 2, 2, [1.0, 1.05, 0.95]) + rows_for("new", 2, 2, [1.15, 1.2, 1.1])
    rows += rows_for("new", 2, 2, [1.0], status="failed")  # a stored failure counts in repeats
    rep = compare(rows, OPTS)
    (c,) = rep.comparisons
    assert c.verdict == "inconclusive" and c.needed is not None and 3 < c.needed <= 30
    assert c.stored == (3, 4)
    assert verdict_text(c) == f"INCONCLUSIVE (~{c.needed} trials/tag)"
    assert settle_plan(rep) == [(KEY, "old", c.needed), (KEY, "new", c.needed + 1)]
    cmd = ("python -m hcp_tune sweep cluster=local model=tiny tp=1 cp=4 seq=4096 "
           f"runner=attention env_tag=new search.repeats={c.needed + 1} search.early_stop=false")
    assert sweep_command(KEY, "new", c.needed + 1) == cmd
    assert any(line.endswith(cmd) for line in next_steps(rep))


def test_more_trials_settle_the_same_change():
    """The interval narrows with trials: the same spread, measured 10 times, is decided."""
    few = compare(rows_for("old", 2, 2, [1.0, 1.02, 0.98, 1.01, 0.99])
                  + rows_for("new", 2, 2, [1.10, 1.12, 1.08, 1.11, 1.09]), OPTS)
    many = compare(rows_for("old", 2, 2, [1.0, 1.02, 0.98] * 4)
                   + rows_for("new", 2, 2, [1.10, 1.12, 1.08] * 4), OPTS)
    assert only(few).verdict == "regression"  # 2% spread: 5 trials suffice for +10%
    assert only(many).verdict == "regression"
    noisy = [0.9, 1.0, 1.1]
    three = compare(rows_for("old", 2, 2, noisy) + rows_for("new", 2, 2, [x * 1.3 for x in noisy]),
                    OPTS)
    twelve = compare(rows_for("old", 2, 2, noisy * 4)
                     + rows_for("new", 2, 2, [x * 1.3 for x in noisy] * 4), OPTS)
    assert only(three).verdict == "inconclusive"
    assert only(twelve).verdict == "regression"


def only(report):
    (c,) = report.comparisons
    return c


def test_trials_to_settle_grows_with_spread_and_is_capped():
    tight = trials_to_settle([1.0, 1.05, 0.95], [1.1, 1.15, 1.05], 1.1, 0.05, cap=100)
    loose = trials_to_settle([1.0, 1.2, 0.8], [1.1, 1.3, 0.9], 1.1, 0.05, cap=100)
    assert 3 < tight < loose <= 100
    assert trials_to_settle([1.0, 1.2, 0.8], [1.1, 1.3, 0.9], 1.1, 0.05, cap=loose - 1) is None
    assert trials_to_settle([1.0, 1.2, 0.8], [1.05, 1.25, 0.85], 1.05, 0.05, cap=100) is None
    assert trials_to_settle([1.0] * 3, [1.0] * 3, 1.0, 0.05, cap=10) == 4  # one more each


def test_a_change_about_the_size_of_the_bound_is_left_to_the_user():
    rows = rows_for("old", 2, 2, [1.0, 1.2, 0.8]) + rows_for("new", 2, 2, [1.05, 1.25, 0.85])
    rep = compare(rows, Options(baseline="old", candidate="new", max_trials=10))
    assert only(rep).needed is None and settle_plan(rep) == []
    assert any("more than 10 trials per tag would likely be needed" in x for x in next_steps(rep))


def test_noise_floor_off_makes_the_threshold_the_bound():
    rows = rows_for("old", 2, 2, [1.0, 1.3, 0.8]) + rows_for("new", 2, 2, [1.1, 1.35, 0.9])
    c = only(compare(rows, Options(baseline="old", candidate="new", noise_floor=False)))
    assert c.noise_floor == pytest.approx(0.2) and c.bound == 0.05


@pytest.mark.parametrize("note,fp,judged", [
    (CUDA_MEM, FP, True),
    ("device memory used (nvml), max over ranks", FP, True),  # the Bridge runner's
    ("torch max_memory_reserved, max over ranks", FP, True),
    (CPU_MEM, FP, False),
    ("not measured on CPU", FP, False),
    ("", {**FP, "gpu": "NVIDIA H100 80GB HBM3"}, True),  # an older GPU row: the allocator's
    ("", FP, False),  # an older CPU row: peak-RSS growth
])
def test_memory_is_judged_only_on_device_readings(note, fp, judged):
    rows = (rows_for("old", 2, 2, [1.0] * 3, mem=1000, mem_note=note, fp=fp)
            + rows_for("new", 2, 2, [1.0] * 3, mem=1300, mem_note=note, fp=fp))
    rep = compare(rows, OPTS)
    c = only(rep)
    if judged:
        assert c.mem_verdict == "regression" and rep.exit_code == 1
    else:
        assert c.mem_verdict == "n/a" and rep.exit_code == 0
        assert c.mem_reason.startswith("old: not a per-trial device measurement")
        assert any(x.startswith("memory not judged for [2,2]: old: ") for x in next_steps(rep))


def test_memory_reason_names_the_cpu_note():
    (r,) = rows_for("a", 2, 2, [1.0], mem_note=CPU_MEM)
    assert memory_not_measured(r, FP) == ("not a per-trial device measurement (CPU: growth of "
                                          "peak RSS (ru_maxrss) from before warm-up to the "
                                          "last step)")
    (none,) = rows_for("a", 2, 2, [1.0], status="failed")
    assert memory_not_measured(none, FP) == "no memory figure recorded"


def test_one_confirmed_layout_wins_over_an_inconclusive_one():
    rows = (rows_for("old", 1, 4, [1.0, 1.01, 0.99] * 2) + rows_for("new", 1, 4, [1.3, 1.31, 1.29] * 2)
            + rows_for("old", 4, 1, [1.0, 1.3, 0.8]) + rows_for("new", 4, 1, [1.1, 1.35, 0.9]))
    rep = compare(rows, OPTS)
    assert {c.layout: c.verdict for c in rep.comparisons} == {"[1,4]": "regression",
                                                              "[4,1]": "inconclusive"}
    assert rep.exit_code == 1 and len(rep.inconclusive) == 1


# ---------------------------------------------------------------- settle=true


class RecordedSweeps:
    """Stands in for ``python -m hcp_tune sweep``: brings a tag's stored trials of every
    layout up to ``search.repeats`` from a recorded sequence of per-trial medians."""

    def __init__(self, rows: list[dict], future: dict[str, list[float]]):
        self.rows, self.future, self.calls = list(rows), future, []

    def __call__(self, args: list[str]) -> int:
        self.calls.append(args)
        kv = dict(a.split("=", 1) for a in args[1:])
        tag, repeats = kv["env_tag"], int(kv["search.repeats"])
        have = sum(r["env_tag"] == tag for r in self.rows)
        for i in range(have, repeats):
            self.rows += rows_for(tag, 2, 2, [self.future[tag][i % len(self.future[tag])]])
        return 0


def test_settle_measures_until_the_inconclusive_layout_is_decided():
    old, new = [1.0, 1.05, 0.95], [1.15, 1.2, 1.1]
    sweeps = RecordedSweeps(rows_for("old", 2, 2, old) + rows_for("new", 2, 2, new),
                            {"old": old, "new": new})
    assert compare(sweeps.rows, OPTS).exit_code == 4
    report, log = settle(lambda: sweeps.rows, sweeps, OPTS, candidate_args=["executor=local"],
                         baseline_args=["executor=local", "executor.container_image=/old.sqsh"],
                         say=lambda line: None)
    assert only(report).verdict == "regression" and report.exit_code == 1
    tags = [dict(a.split("=", 1) for a in c[1:])["env_tag"] for c in sweeps.calls]
    assert set(tags) == {"old", "new"} and len(log) == len(sweeps.calls)
    base_call = sweeps.calls[tags.index("old")]
    assert base_call[:3] == ["sweep", "executor=local", "executor.container_image=/old.sqsh"]
    assert base_call[-2:] == [base_call[-2], "search.early_stop=false"]


def test_settle_measures_the_baseline_only_where_its_environment_is_given():
    old, new = [1.0, 1.05, 0.95], [1.15, 1.2, 1.1]
    sweeps = RecordedSweeps(rows_for("old", 2, 2, old) + rows_for("new", 2, 2, new),
                            {"old": old, "new": new})
    report, _ = settle(lambda: sweeps.rows, sweeps, OPTS, candidate_args=[],
                       say=lambda line: None)
    assert sweeps.calls and all("env_tag=new" in c for c in sweeps.calls)
    assert report.exit_code in (1, 4)


def test_settle_stops_at_the_cap_when_the_change_is_about_the_bound():
    old, new = [1.0, 1.2, 0.8], [1.05, 1.25, 0.85]
    sweeps = RecordedSweeps(rows_for("old", 2, 2, old) + rows_for("new", 2, 2, new),
                            {"old": old, "new": new})
    opts = Options(baseline="old", candidate="new", max_trials=6)
    report, _ = settle(lambda: sweeps.rows, sweeps, opts, candidate_args=[], baseline_args=[],
                       say=lambda line: None)
    assert sweeps.calls == [] and only(report).inconclusive and report.exit_code == 4


@pytest.mark.parametrize("rc", [1, 2])
def test_settle_reports_a_failed_sweep(rc):
    rows = rows_for("old", 2, 2, [1.0, 1.05, 0.95]) + rows_for("new", 2, 2, [1.15, 1.2, 1.1])
    failing = lambda args: rc  # noqa: E731
    if rc == 2:
        with pytest.raises(RegressError, match=r"settle: `python -m hcp_tune sweep .* "
                                               r"env_tag=new .*` refused its input \(exit 2"):
            settle(lambda: rows, failing, OPTS, candidate_args=[], say=lambda line: None)
        return
    report, log = settle(lambda: rows, failing, OPTS, candidate_args=[], say=lambda line: None)
    assert report.exit_code == 4 and log[0].endswith(": exit 1")
    assert report.warnings[-1].startswith("settle stopped: the sweep `python -m hcp_tune sweep")


# ---------------------------------------------------------------- the recorded CPU pool

CLEAN = ("pool-1", "pool-2", "pool-3", "pool-4")


def interleaved(tags, per_tag: int) -> list[dict]:
    """The recorded trials of ``tags`` split alternately (in trial order, per layout and
    session) into tags ``a`` and ``b``, ``per_tag`` trials per session each."""
    rows = []
    for t in tags:
        for a2a in (1, 2):
            got = sorted((r for r in pool_rows(t) if r["a2a"] == a2a), key=lambda r: r["trial_id"])
            rows += retag(got[0:2 * per_tag:2], "a") + retag(got[1:2 * per_tag:2], "b")
    return rows


@pytest.mark.parametrize("tags,per_tag", [((t,), n) for t in CLEAN for n in (3, 4)]
                         + [(CLEAN, 4)])
def test_identical_code_measured_interleaved_is_never_a_confirmed_change(tags, per_tag):
    """Issue 23's A/A on recorded rows: one code version, its trials alternately given to
    two tags (so both saw the same machine load), 3 or 4 trials per tag from one session,
    and 16 per tag over all four: exit 0 or 4, never 1. (Sessions recorded at different
    load are another matter: docs/regress.md, "What the CPU pool shows".)"""
    rep = compare(interleaved(tags, per_tag), Options(baseline="a", candidate="b"))
    assert len(rep.comparisons) == 2
    assert rep.exit_code in (0, 4), [(c.layout, c.ratio, c.ci, c.bound) for c in rep.comparisons]


def test_the_recorded_injected_delay_is_confirmed_on_the_ring_only():
    """bigdelay-1: HCP_TUNE_INJECT_DELAY=p2p:0.05 slows the ring layout [1,2] several-fold;
    against all four clean sessions it is a confirmed regression, the sweep exits 1."""
    rows = retag(pool_rows(*CLEAN), "clean") + pool_rows("bigdelay-1")
    rep = compare(rows, Options(baseline="clean", candidate="bigdelay-1"))
    verdicts = {c.layout: c.verdict for c in rep.comparisons}
    assert verdicts["[1,2]"] == "regression" and rep.exit_code == 1
    assert any("HCP_TUNE_INJECT_DELAY=p2p:0.05" in w for w in rep.warnings)


def test_the_settling_sweep_names_only_the_key_fields_off_their_defaults():
    """dp, mbs and the micro-batches joined the key: at their defaults the command leaves
    them out (as pp=1); a key's micro-batches come back as the global batch gbs=m*mbs*dp."""
    from hcp_tune.outputs.regress_settle import sweep_args

    bridge = ("local", "tiny", 1, 2, 4, 4096, "bridge", 2, 1, 8)
    assert sweep_args(bridge, "t", 5)[1:9] == [
        "cluster=local", "model=tiny", "tp=1", "pp=2", "cp=4", "seq=4096", "runner=bridge",
        "dp=2"]
    assert "gbs=16" in sweep_args(bridge, "t", 5)
    assert not any(a.startswith(("dp=", "mbs=", "gbs=")) for a in sweep_args(KEY, "t", 5))
