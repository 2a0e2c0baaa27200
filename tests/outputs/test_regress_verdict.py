"""``regress``'s decision rule on a night of layouts: a common shift and per-layout
deviations (a planted slowdown on 3 layouts is flagged, the same code under two tags is
not, a uniform slowdown is one release-wide REGRESSION), Holm's correction, memory with
an interval, the interleaved (paired) design, the power plan, the group-sequential
``settle=true`` (with recorded sweeps standing in for the real ones), and ``search.purpose``.
"""
import math
import random

import pytest
from helpers import CPU_MEM, CUDA_MEM, pool_rows, retag, rows_for

from hcp_tune.outputs.regress import Options, RegressError, compare, stats
from hcp_tune.outputs.regress.rows import memory_not_measured
from hcp_tune.outputs.regress.settle import settle, settle_plan, sweep_args, sweep_command
from hcp_tune.outputs.regress.view import next_steps, summary_line, verdict_text

OPTS = Options(baseline="old", candidate="new", session_spread=0.0, layout_spread=0.0)
KEY = ("local", "tiny", 1, 1, 4, 4096, "attention", 1, 1, 1, "")  # COMPARED: dp, mbs, m, mix
LAYOUTS = [(seq, a2a, 8 // a2a) for seq in (4096, 8192, 16384, 32768) for a2a in (1, 2, 4, 8)]


def night(slow: dict, *, shift=1.0, sd=0.02, n=5, seed=0, mem=None, **kw) -> list[dict]:
    """16 layouts (4 seqs x 4 layouts of cp=8), ``n`` trials per tag with per-trial spread
    ``sd``; the candidate is ``shift`` slower everywhere and ``slow[layout]`` more."""
    rng = random.Random(seed)
    rows = []
    for lay in LAYOUTS:
        seq, a2a, p2p = lay
        for tag, f in (("old", 1.0), ("new", shift * slow.get(lay, 1.0))):
            rows += rows_for(tag, a2a, p2p, [f * rng.lognormvariate(0, sd) for _ in range(n)],
                             seq=seq, **kw)
    return rows


PLANTED = {LAYOUTS[1]: 1.08, LAYOUTS[6]: 1.08, LAYOUTS[11]: 1.08}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_planted_8_percent_slowdown_on_3_layouts_is_flagged_and_only_those(seed):
    rep = compare(night(PLANTED, shift=1.02, seed=seed), OPTS)
    flagged = {(c.key[5], c.a2a, c.p2p) for c in rep.flagged}
    assert flagged == set(PLANTED)
    assert all(c.verdict == "regression" for c in rep.flagged)
    assert rep.shift.verdict == "ok" and abs(rep.shift.ratio() - 1.02) < 0.01
    assert rep.exit_code == 1
    assert "family-wise error rate 0.05 (Holm over 17 tests" in summary_line(rep)


@pytest.mark.parametrize("seed", range(4))
def test_the_same_code_under_two_tags_with_a_session_shift_is_not_flagged(seed):
    """One session per tag: the candidate's session ran 3% slower (below the threshold),
    3% per-trial noise, 5 trials: no layout and no shift is confirmed."""
    rep = compare(night({}, shift=1.03, sd=0.03, seed=seed), OPTS)
    assert not rep.flagged and not rep.shift_flagged and rep.exit_code in (0, 4)


def test_a_uniform_slowdown_is_one_regression_of_the_release_not_16():
    rep = compare(night({}, shift=1.08, seed=3), OPTS)
    assert rep.shift.verdict == "regression" and rep.shift.ratio_interval()[0] > 1.05
    assert not rep.flagged and rep.exit_code == 1  # no layout deviates from the shift
    assert "common step time shift REGRESSION x1.0" in summary_line(rep)


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5]) == [0.5]


def test_a_layout_noisier_than_the_rest_keeps_its_own_variance():
    s2 = [1e-4] * 15 + [1e-2]
    post, df, s0sq, d0 = stats.moderate(s2, [8] * 16)
    assert post[0] == pytest.approx(1e-4, rel=0.5) and post[-1] > 10 * post[0]
    assert d0 > 0 and df[0] > 8


def test_memory_is_judged_with_an_interval_and_the_same_trials_as_time():
    rows = (rows_for("old", 2, 2, [1.0, 1.01, 0.99], mem=1000, mem_note=CUDA_MEM)
            + rows_for("new", 2, 2, [1.0, 1.01, 0.99], mem=1100, mem_note=CUDA_MEM))
    (c,) = compare(rows, OPTS).comparisons
    lo, hi = c.mem_est.ratio_interval()
    assert c.mem_verdict == "regression" and 1.05 < lo <= 1.1 <= hi
    noisy = compare(rows_for("old", 2, 2, [1.0] * 3, mem=1000, mem_note=CUDA_MEM)
                    + [r for m in (1000, 1300, 900) for r in
                       rows_for("new", 2, 2, [1.0], mem=m, mem_note=CUDA_MEM)], OPTS)
    assert noisy.comparisons[0].mem_verdict == "inconclusive"  # 3 noisy readings: no verdict


@pytest.mark.parametrize("note,gpu,judged", [(CUDA_MEM, None, True), (CPU_MEM, None, False),
                                             ("", "H100", True), ("", None, False)])
def test_memory_is_judged_only_on_device_readings(note, gpu, judged):
    from helpers import FP

    row = rows_for("t", 2, 2, [1.0], mem_note=note)[0]
    assert (memory_not_measured(row, {**FP, "gpu": gpu}) is None) == judged


def test_interleaved_pairs_cancel_a_drift_that_one_session_per_tag_cannot():
    """The machine drifts 30% over the run; the tags alternate ABAB, the candidate 8%
    slower. Paired, the drift cancels and the slowdown is confirmed; unpaired it is not."""
    rows = []
    for r in range(6):
        drift = 1 + 0.06 * r
        rows += rows_for("old", 2, 2, [drift * (1 + 0.002 * (-1) ** r)])
        rows += rows_for("new", 2, 2, [drift * 1.08])
    paired = compare(rows, Options(baseline="old", candidate="new", design="interleaved"))
    assert paired.comparisons[0].verdict == "regression"
    assert "design: interleaved ABBA" in summary_line(paired)
    assert compare(rows, OPTS).comparisons[0].verdict == "inconclusive"


def test_power_plan_grows_with_noise_and_refuses_a_change_within_the_threshold():
    plan = lambda effect, sd: stats.trials_for_power(effect, sd, 0.05, nights=60)  # noqa: E731
    sim = lambda n: stats.simulated_power(n, 0.07, 0.02, 0.05, nights=60)  # noqa: E731
    a, b = plan(0.07, 0.02), plan(0.07, 0.04)
    assert a is not None and b is not None and 3 <= a < b
    assert sim(a) >= 0.8 and (a == 3 or sim(a - 1) < 0.8)  # the fewest that reach 80%
    assert stats.power_at(a, 0.07, 0.02, 0.05, 0.05, 97) >= 0.8  # the first guess: optimistic
    assert plan(0.04, 0.02) is None
    assert plan(-0.07, 0.02) is not None  # a speed-up too


def test_alpha_spending_adds_up_to_alpha_and_spends_little_early():
    looks = [5 / 30, 10 / 30, 20 / 30, 1.0]
    spent = [stats.look_alpha(t, u) for t, u in zip(looks, [0.0] + looks[:-1])]
    assert sum(spent) == pytest.approx(0.05) and spent[0] < 1e-4 < spent[-1]
    assert stats.look_alpha(0.5, 0.5) == 0


def test_an_inconclusive_layout_says_how_many_trials_and_which_sweep_settle_it():
    rows = rows_for("old", 2, 2, [1.0, 1.08, 0.93]) + rows_for("new", 2, 2, [1.13, 1.22, 1.04])
    rows += rows_for("new", 2, 2, [1.0], status="failed")  # a stored failure counts in repeats
    rep = compare(rows, OPTS)
    (c,) = rep.comparisons
    assert c.verdict == "inconclusive" and c.needed is not None and 3 < c.needed <= 30
    assert c.stored == (3, 4)
    assert verdict_text(c) == f"INCONCLUSIVE ~{c.needed}/tag"
    assert settle_plan(rep) == [(KEY, "old", c.needed), (KEY, "new", c.needed + 1)]
    cmd = ("python -m hcp_tune sweep cluster=local model=tiny tp=1 cp=4 seq=4096 "
           f"runner=attention env_tag=new search.repeats={c.needed + 1} search.purpose=regress")
    assert sweep_command(KEY, "new", c.needed + 1) == cmd
    assert any(line.endswith(cmd) for line in next_steps(rep))


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


OLD, NEW = [1.0, 1.08, 0.93], [1.13, 1.22, 1.04]


def test_settle_measures_until_the_inconclusive_layout_is_decided_spending_alpha():
    sweeps = RecordedSweeps(rows_for("old", 2, 2, OLD) + rows_for("new", 2, 2, NEW),
                            {"old": OLD, "new": NEW})
    assert compare(sweeps.rows, OPTS).exit_code == 4
    report, log = settle(lambda: sweeps.rows, sweeps, OPTS, candidate_args=["executor=local"],
                         baseline_args=["executor=local", "executor.container_image=/old.sqsh"],
                         say=lambda line: None)
    (c,) = report.comparisons
    assert c.verdict == "regression" and report.exit_code == 1
    assert report.alpha < OPTS.alpha  # this look spent only part of the rate
    assert any("O'Brien-Fleming alpha spending" in w for w in report.warnings)
    tags = [dict(a.split("=", 1) for a in c[1:])["env_tag"] for c in sweeps.calls]
    assert set(tags) == {"old", "new"} and len(log) == len(sweeps.calls)
    base_call = sweeps.calls[tags.index("old")]
    assert base_call[:3] == ["sweep", "executor=local", "executor.container_image=/old.sqsh"]
    assert base_call[-1] == "search.purpose=regress"


def test_settle_measures_the_baseline_only_where_its_environment_is_given():
    sweeps = RecordedSweeps(rows_for("old", 2, 2, OLD) + rows_for("new", 2, 2, NEW),
                            {"old": OLD, "new": NEW})
    settle(lambda: sweeps.rows, sweeps, OPTS, candidate_args=[], say=lambda line: None)
    assert sweeps.calls and all("env_tag=new" in c for c in sweeps.calls)


def test_settle_stops_at_the_cap_when_the_change_is_about_the_threshold():
    old, new = [1.0, 1.2, 0.8], [1.05, 1.25, 0.85]
    sweeps = RecordedSweeps(rows_for("old", 2, 2, old) + rows_for("new", 2, 2, new),
                            {"old": old, "new": new})
    opts = Options(baseline="old", candidate="new", max_trials=6)
    report, _ = settle(lambda: sweeps.rows, sweeps, opts, candidate_args=[], baseline_args=[],
                       say=lambda line: None)
    assert sweeps.calls == [] and report.comparisons[0].inconclusive and report.exit_code == 4


@pytest.mark.parametrize("rc", [1, 2])
def test_settle_reports_a_failed_sweep(rc):
    rows = rows_for("old", 2, 2, OLD) + rows_for("new", 2, 2, NEW)
    failing = lambda args: rc  # noqa: E731
    if rc == 2:
        with pytest.raises(RegressError, match=r"settle: `python -m hcp_tune sweep .* "
                                               r"env_tag=new .*` refused its input \(exit 2"):
            settle(lambda: rows, failing, OPTS, candidate_args=[], say=lambda line: None)
        return
    report, log = settle(lambda: rows, failing, OPTS, candidate_args=[], say=lambda line: None)
    assert report.exit_code == 4 and log[0].endswith(": exit 1")
    assert report.warnings[-1].startswith("settle stopped: the sweep `python -m hcp_tune sweep")


def test_the_settling_sweep_names_only_the_key_fields_off_their_defaults():
    bridge = ("local", "tiny", 1, 2, 4, 4096, "bridge", 2, 1, 8)
    assert sweep_args(bridge, "t", 5)[1:9] == [
        "cluster=local", "model=tiny", "tp=1", "pp=2", "cp=4", "seq=4096", "runner=bridge",
        "dp=2"]
    assert "gbs=16" in sweep_args(bridge, "t", 5)
    assert not any(a.startswith(("dp=", "mbs=", "gbs=")) for a in sweep_args(KEY, "t", 5))


# ---------------------------------------------------------------- the recorded CPU pool

CLEAN = ("pool-1", "pool-2", "pool-3", "pool-4")


def test_the_recorded_injected_delay_is_confirmed_only_where_sessions_agree():
    """bigdelay-1: HCP_TUNE_INJECT_DELAY=p2p:0.05 slows the ring layout [1,2] several-fold.
    One session per tag on the loaded 2-core machine, whose sessions differ by up to 3x
    (the local profile's S=42%): two layouts cannot tell that from a session, so it is
    INCONCLUSIVE; where sessions agree within 2% it is a confirmed regression, exit 1."""
    rows = retag(pool_rows(*CLEAN), "clean") + pool_rows("bigdelay-1")
    loaded = compare(rows, Options(baseline="clean", candidate="bigdelay-1"))
    assert {c.layout: c.verdict for c in loaded.comparisons}["[1,2]"] == "inconclusive"
    assert loaded.spread.source == "cluster profile local" and loaded.spread.session == 0.42
    quiet = compare(rows, Options(baseline="clean", candidate="bigdelay-1",
                                  session_spread=0.02, layout_spread=0.0))
    assert {c.layout: c.verdict for c in quiet.comparisons}["[1,2]"] == "regression"
    assert quiet.exit_code == 1
    assert any("HCP_TUNE_INJECT_DELAY=p2p:0.05" in w for w in quiet.warnings)


# ---------------------------------------------------------------- search.purpose


def test_a_regress_purpose_never_early_stops_nor_measures_adaptively():
    from hcp_tune import config
    from hcp_tune.errors import ConfigError

    cfg = config.load(["search.purpose=regress", "search.early_stop=true",
                       "search.adaptive=true"])
    assert cfg.search.early_stop is False and cfg.search.adaptive is False
    assert config.load([]).search.adaptive  # a tuning sweep stays adaptive by default
    assert config.load([]).search.purpose == "tune" and config.load([]).search.early_stop
    with pytest.raises(ConfigError, match=r"search.purpose='maybe': expected one of tune, "
                                          r"regress"):
        config.load(["search.purpose=maybe"])


def test_estimates_are_on_the_log_scale():
    e = stats.Estimate(math.log(1.1), 0.01, math.inf, 0.0)
    lo, hi = e.ratio_interval()
    assert e.ratio() == pytest.approx(1.1) and lo < 1.1 < hi
