"""``regress``'s verdicts on recorded rows, its one-line errors, and the CLI's exit codes."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CUDA_MEM, FP, rows_for, store  # noqa: E402

from hcp_tune.outputs.regress import MIN_TRIALS, Options, RegressError, compare  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BASE = [1.00, 1.01, 0.99]
BASE5 = [1.00, 1.01, 0.99, 1.005, 0.995]
OPTS = Options(baseline="old", candidate="new", session_spread=0.0, layout_spread=0.0)
# the rows here: both tags measured in one session (no session spread between them)
ONE_SESSION = ("session_spread=0", "layout_spread=0")


def only(report):
    (c,) = report.comparisons
    return c


def test_no_change_is_ok_and_exit_0():
    rep = compare(rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, [1.005, 0.995, 1.01]), OPTS)
    c = only(rep)
    assert c.verdict == "ok" and c.mem_verdict == "n/a"  # a row without a device reading
    assert 0.95 <= c.ci[0] <= c.ratio <= c.ci[1] <= 1.05 and c.ci[0] < 1 < c.ci[1]
    assert rep.exit_code == 0 and not rep.warnings


def test_real_slowdown_is_a_regression_with_an_interval_above_one():
    rep = compare(rows_for("old", 2, 2, BASE5)
                  + rows_for("new", 2, 2, [1.20, 1.21, 1.19, 1.2, 1.2]), OPTS)
    c = only(rep)
    assert c.verdict == "regression"
    assert c.ratio == pytest.approx(1.20 / 1.00, rel=1e-3)
    assert c.ci[0] > 1.05  # the whole interval is past the threshold
    assert rep.exit_code == 1


def test_change_within_noise_is_inconclusive_not_flagged_though_above_threshold():
    noisy = [1.0, 1.3, 0.8]  # p10-p90 half-width 20% of the median
    rep = compare(rows_for("old", 2, 2, noisy) + rows_for("new", 2, 2, [1.1, 1.35, 0.9]), OPTS)
    c = only(rep)
    assert c.ratio - 1 > OPTS.threshold
    assert c.ci[0] < 1 + OPTS.threshold < c.ci[1]  # the interval straddles the threshold
    assert c.verdict == "inconclusive" and not c.flagged
    assert rep.exit_code == 4


def test_speedup_beyond_the_bound_is_an_unexpected_improvement():
    rep = compare(rows_for("old", 2, 2, BASE5) + rows_for("new", 2, 2, [0.8, 0.81, 0.79] + [0.8] * 2),
                  OPTS)
    assert only(rep).verdict == "improvement"
    assert rep.exit_code == 1


def test_memory_regression_is_flagged_when_time_is_unchanged():
    rep = compare(rows_for("old", 2, 2, BASE, mem=1000, mem_note=CUDA_MEM)
                  + rows_for("new", 2, 2, BASE, mem=1100, mem_note=CUDA_MEM), OPTS)
    c = only(rep)
    assert c.verdict == "ok"
    assert c.mem_ratio == pytest.approx(1.1) and c.mem_verdict == "regression"
    assert rep.exit_code == 1


def test_memory_within_threshold_and_zero_baseline_are_not_flagged():
    within = compare(rows_for("old", 2, 2, BASE, mem=1000, mem_note=CUDA_MEM)
                     + rows_for("new", 2, 2, BASE, mem=1040, mem_note=CUDA_MEM), OPTS)
    assert only(within).mem_verdict == "ok"
    zero = compare(rows_for("old", 2, 2, BASE, mem=0, mem_note=CUDA_MEM)
                   + rows_for("new", 2, 2, BASE, mem=4096, mem_note=CUDA_MEM), OPTS)
    assert only(zero).mem_verdict == "n/a" and zero.exit_code == 0
    assert only(zero).mem_reason == "a peak memory of 0 recorded"


def test_changed_winner_is_reported_per_key():
    rows = (rows_for("old", 1, 4, [1.0] * 5) + rows_for("old", 4, 1, [1.2] * 5)
            + rows_for("new", 1, 4, [1.3] * 5) + rows_for("new", 4, 1, [1.2] * 5))
    rep = compare(rows, OPTS)
    (key,) = rep.keys
    assert (key.base_winner, key.cand_winner) == ("[1,4]", "[4,1]")
    assert key.winner_changed and not key.winner_tie
    assert {c.layout: c.verdict for c in key.layouts} == {"[1,4]": "regression", "[4,1]": "ok"}


def test_winner_change_within_noise_is_called_a_tie():
    rows = (rows_for("old", 1, 4, [1.0, 1.0, 1.0]) + rows_for("old", 4, 1, [1.01, 1.01, 1.01])
            + rows_for("new", 1, 4, [1.01, 0.9, 1.12]) + rows_for("new", 4, 1, [1.0, 1.0, 1.0]))
    (key,) = compare(rows, OPTS).keys
    assert key.winner_changed and key.winner_tie


def test_unchanged_winner():
    rows = rows_for("old", 1, 4, BASE) + rows_for("new", 1, 4, BASE)
    (key,) = compare(rows, OPTS).keys
    assert not key.winner_changed


@pytest.mark.parametrize("n_old,n_new", [(2, 3), (3, 2), (1, 1)])
def test_too_few_trials_is_refused_naming_the_layout_and_counts(n_old, n_new):
    rows = rows_for("old", 2, 2, BASE[:n_old]) + rows_for("new", 2, 2, BASE[:n_new])
    with pytest.raises(RegressError) as e:
        compare(rows, OPTS)
    msg = str(e.value)
    assert f"needs >= {MIN_TRIALS} ok, verified trials" in msg
    assert f"cp=4 seq=4096 runner=attention [2,2] (old: {n_old}, new: {n_new})" in msg
    assert "search.repeats=3" in msg


def test_exactly_three_trials_is_enough():
    assert compare(rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE), OPTS).comparisons


def test_a_slowdown_within_noise_asks_for_the_trials_that_give_80_percent_power():
    noisy = [1.0, 1.08, 0.93]  # ~7% per-trial spread: a 13% slowdown is not yet confirmed
    rep = compare(rows_for("old", 2, 2, noisy) + rows_for("new", 2, 2, [1.13, 1.22, 1.04]), OPTS)
    c = only(rep)
    assert c.verdict == "inconclusive" and rep.exit_code == 4
    assert c.needed is not None and 3 < c.needed <= OPTS.max_trials
    clear = compare(rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, [1.3] * 3), OPTS)
    assert only(clear).verdict == "regression"  # a change far beyond the noise: 3 trials do


def test_failed_trials_do_not_count_and_a_layout_that_now_fails_is_flagged():
    rows = (rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, [1, 1, 1], status="failed"))
    rep = compare(rows, OPTS)
    assert only(rep).verdict == "failing" and rep.exit_code == 1


def test_unknown_tag_names_the_tags_that_exist():
    rows = rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE)
    with pytest.raises(RegressError, match=r"unknown env tag\(s\) newer; tags with stored "
                                           r"trials: new, old"):
        compare(rows, Options(baseline="old", candidate="newer", session_spread=0.0))


def test_no_common_keys_names_each_tags_keys():
    rows = rows_for("old", 2, 2, BASE, seq=4096) + rows_for("new", 2, 2, BASE, seq=8192)
    with pytest.raises(RegressError) as e:
        compare(rows, OPTS)
    assert "no common keys: old has cluster=local model=tiny tp=1 cp=4 seq=4096" in str(e.value)
    assert "new has cluster=local model=tiny tp=1 cp=4 seq=8192" in str(e.value)


def test_filters_select_keys():
    rows = (rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, [1.2] * 3)
            + rows_for("old", 2, 2, BASE, model="tiny-gqa") + rows_for("new", 2, 2, BASE,
                                                                       model="tiny-gqa"))
    rep = compare(rows, Options(baseline="old", candidate="new", model="tiny-gqa", session_spread=0.0,
                                layout_spread=0.0))
    assert [c.key[1] for c in rep.comparisons] == ["tiny-gqa"] and rep.exit_code == 0


@pytest.mark.parametrize("bad", [{"threshold": float("inf")}, {"mem_threshold": -0.1}])
def test_options_reject_negative_or_infinite_thresholds(bad):
    name = next(iter(bad))
    with pytest.raises(RegressError, match=f"{name}=.*expected a fraction in"):
        Options(baseline="a", candidate="b", **bad)


def test_injected_delay_rows_are_flagged():
    fp = {**FP, "inject_delay": "p2p:0.05"}
    rep = compare(rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE, fp=fp), OPTS)
    assert rep.warnings == ["new: 3 trial(s) ran with an injected delay "
                            "(HCP_TUNE_INJECT_DELAY=p2p:0.05): a testing aid, not a real "
                            "measurement"]


def test_rows_of_one_tag_with_different_versions_or_settings_are_reported():
    newer = {**FP, "transformer_engine": "2.10.0", "settings": {"NCCL_ALGO": "Ring"}}
    rows = (rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE[:2])
            + rows_for("new", 2, 2, BASE[2:], fp=newer))
    (line,) = compare(rows, OPTS).warnings
    assert line.startswith("new: rows under this tag differ in ")
    assert "settings.NCCL_ALGO (Ring x1, unset x2)" in line
    assert "transformer_engine (2.10.0 x1, 2.9.0 x2)" in line


def test_host_names_alone_do_not_make_rows_differ():
    other_host = {**FP, "hosts": ["node7"]}
    rows = rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE[:2]) + rows_for(
        "new", 2, 2, BASE[2:], fp=other_host)
    assert compare(rows, OPTS).warnings == []


# ---------------------------------------------------------------- the CLI


def run(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def results(tmp_path):
    rows = (rows_for("old", 1, 4, BASE5) + rows_for("old", 4, 1, BASE)
            + rows_for("new", 1, 4, [1.3, 1.31, 1.29, 1.3, 1.3]) + rows_for("new", 4, 1, BASE)
            + rows_for("few", 1, 4, BASE[:2]))
    return store(tmp_path / "res", rows)


def test_cli_flags_a_regression_exit_1_and_writes_md_and_html(results):
    r = run("regress", "baseline=old", "candidate=new", *ONE_SESSION, f"results_dir={results}")
    assert r.returncode == 1, r.stderr
    assert "1 of 2 key/layout(s) flagged" in r.stdout and "REGRESSION" in r.stdout
    md = (results / "regress-old-vs-new.md").read_text()
    assert "| [1,4] p2p | 5/5 | 1 | 1.300 | 1.300 |" in md
    assert "winner changed" not in md and "## Method" in md
    assert "<svg" in (results / "regress-old-vs-new.html").read_text()


def test_cli_no_regression_exits_0(results):
    r = run("regress", "baseline=old", "candidate=new", *ONE_SESSION, f"results_dir={results}",
            "threshold=0.5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no regression in 2 key/layout(s)" in r.stdout


@pytest.mark.parametrize("args,message", [
    (["baseline=old", "candidate=nope"],
     "unknown env tag(s) nope; tags with stored trials: few, new, old"),
    (["baseline=old", "candidate=few"], "too few trials: regress needs >= 3"),
    (["baseline=old"], "regress needs candidate=TAG"),
    (["baseline=old", "candidate=new", "threshold=big"], "threshold='big': expected a number, e.g. threshold=0.05"),
    (["baseline=old", "candidate=new", "threshold=-2"], "threshold=-2.0: expected a fraction"),
    (["baseline=old", "candidate=new", "colour=red"],
     "colour=red: regress takes key=value arguments: baseline, candidate"),
    (["baseline=old", "candidate=new", "model=llama3-8b"],
     "unknown env tag(s) old, new (with model=llama3-8b)"),
    (["baseline=old", "candidate=old"], "are the same tag"),
    (["baseline=old", "candidate=new", "max_trials=x"], "max_trials='x': expected an integer"),
    (["baseline=old", "candidate=new", "ci=95"], "ci=95.0: expected the interval's coverage"),
    (["baseline=old", "candidate=new", "alpha=0.7"], "alpha=0.7: expected the family-wise"),
    (["baseline=old", "candidate=new", "paired=maybe"],
     "paired='maybe': expected true or false, e.g. paired=false"),
    (["baseline=old", "candidate=new", "max_trials=2"], "max_trials=2: expected an integer >= 3"),
    (["baseline=old", "candidate=new", "candidate_args=executor=local"],
     "candidate_args=executor=local: only used with settle=true"),
])
def test_cli_bad_input_exits_2_with_one_line_and_nothing_written(results, args, message):
    r = run("regress", *args, *ONE_SESSION, f"results_dir={results}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(results.glob("regress-*"))


def test_cli_inconclusive_exits_4_and_prints_the_sweep_that_settles_it(tmp_path):
    res = store(tmp_path / "res", rows_for("old", 2, 2, [1.0, 1.08, 0.93])
                + rows_for("new", 2, 2, [1.13, 1.22, 1.04]))
    r = run("regress", "baseline=old", "candidate=new", *ONE_SESSION, f"results_dir={res}")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "no confirmed change in 1 key/layout(s); 1 inconclusive (measure more)" in r.stdout
    assert ("python -m hcp_tune sweep cluster=local model=tiny tp=1 cp=4 seq=4096 "
            "runner=attention env_tag=new search.repeats=") in r.stdout
    md = (res / "regress-old-vs-new.md").read_text()
    assert "## Next steps" in md and "INCONCLUSIVE ~" in md


def test_cli_settle_passes_a_sweeps_refusal_on_as_exit_2(tmp_path):
    res = store(tmp_path / "res", rows_for("old", 2, 2, [1.0, 1.08, 0.93])
                + rows_for("new", 2, 2, [1.13, 1.22, 1.04]))
    r = run("regress", "baseline=old", "candidate=new", *ONE_SESSION, f"results_dir={res}", "settle=true",
            "candidate_args=executor=local executor.no_such_key=1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "executor.no_such_key" in r.stderr  # the sweep's own line
    assert ("settle: `python -m hcp_tune sweep executor=local executor.no_such_key=1 "
            f"results_dir={res} cluster=local model=tiny tp=1 cp=4 seq=4096 runner=attention "
            "env_tag=new search.repeats=") in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_empty_results_dir_exits_2(tmp_path):
    r = run("regress", "baseline=a", "candidate=b", f"results_dir={tmp_path}")
    assert r.returncode == 2
    assert f"results_dir={tmp_path}: no stored trials there" in r.stderr


def test_cli_report_writes_a_page_and_refuses_an_unknown_tag(results):
    r = run("report", f"results_dir={results}", "env_tag=new")
    assert r.returncode == 0, r.stderr
    assert (results / "report-new.html").exists() and "1 key(s), 2 measured layout(s)" in r.stdout
    bad = run("report", f"results_dir={results}", "env_tag=zzz")
    assert bad.returncode == 2 and "env tags there: few, new, old" in bad.stderr


@pytest.mark.parametrize("command", ["regress", "report"])
def test_regress_and_report_do_not_import_torch_or_pandas(results, command):
    args = (["baseline=old", "candidate=new", *ONE_SESSION] if command == "regress" else []) + [
        f"results_dir={results}"]
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hcp_tune", command, *args],
                       capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode in (0, 1), r.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines()
                if line.startswith("import time:")}
    assert "hcp_tune" in imported  # the check sees our own imports
    assert not {"torch", "megatron", "pandas"} & imported


def test_recommend_warns_about_rows_with_an_injected_delay(tmp_path):
    from hcp_tune.store.folder import ResultStore

    res = store(tmp_path / "res", rows_for("t", 2, 2, BASE, fp={**FP, "inject_delay": "a2a:1"}))
    ResultStore(res).rebuild()
    r = run("recommend", "cluster=local", "model=tiny", "cp=4", "seq=4096", "env_tag=t",
            f"results_dir={res}")
    assert r.returncode == 0, r.stderr
    assert ("recommend: warning: t: 3 trial(s) ran with an injected delay "
            "(HCP_TUNE_INJECT_DELAY=a2a:1)") in r.stderr


def test_te_regression_preset_measures_every_layout_enough_times_to_confirm():
    from hcp_tune import config

    cfg = config.load(["sweeps=te_regression"])
    assert cfg.search.repeats == 5 and cfg.search.early_stop is False
    assert cfg.search.adaptive is False  # every layout gets its 5 trials
    assert cfg.search.purpose == "regress"  # never early-stops, whatever early_stop says
    assert cfg.runner.name == "attention" and len(cfg.seqs) >= 2
    script = (REPO / "scripts" / "te_regression.sh").read_text()
    assert "MODELS=(llama3-8b llama2-7b)" in script and "CPS=(4 16)" in script
    gqa, mha = (config.load(["sweeps=te_regression", f"model={m}"]).model
                for m in ("llama3-8b", "llama2-7b"))
    assert gqa.kv_heads < gqa.heads and mha.kv_heads == mha.heads


def test_te_regression_script_needs_an_env_tag():
    r = subprocess.run([str(REPO / "scripts" / "te_regression.sh")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "usage: " in r.stderr and "env_tag=NAME" in r.stderr


def test_keys_and_layouts_measured_under_one_tag_only_are_named():
    rows = (rows_for("old", 2, 2, BASE) + rows_for("new", 2, 2, BASE)
            + rows_for("old", 4, 1, BASE) + rows_for("new", 2, 2, BASE, seq=8192))
    rep = compare(rows, OPTS)
    assert rep.warnings == [
        "not compared (measured under one tag only): cluster=local model=tiny tp=1 cp=4 "
        "seq=8192 runner=attention (new only); cluster=local model=tiny tp=1 cp=4 seq=4096 "
        "runner=attention [4,1] (old only)"]
    assert rep.exit_code == 0


def test_a_missing_field_and_none_are_the_same_fingerprint():
    old_job = {k: v for k, v in FP.items() if k not in ("settings", "inject_delay")}
    rows = rows_for("old", 2, 2, BASE[:2]) + rows_for("old", 2, 2, BASE[2:], fp=old_job) + (
        rows_for("new", 2, 2, BASE))
    assert compare(rows, OPTS).warnings == []


def test_keys_differing_only_in_pp_are_never_compared_and_old_rows_are_pp_1():
    from hcp_tune.outputs.regress import key_text, row_key

    # dp, mbs, micro_batches (issue 19) read as 1 on older rows, like pp; mix (issue 37) as ""
    assert row_key({"cluster": "c", "model": "m", "tp": 1, "cp": 4, "seq": 8, "runner": "a"}) \
        == ("c", "m", 1, 1, 4, 8, "a", 1, 1, 1, "")
    assert row_key({"cluster": "c", "model": "m", "tp": 1, "pp": 2, "cp": 4, "seq": 8,
                    "runner": "a", "dp": 2, "micro_batches": 8, "mix": "web#1a2b3c"}) == (
        "c", "m", 1, 2, 4, 8, "a", 2, 1, 8, "web#1a2b3c")
    assert key_text(("c", "m", 1, 1, 4, 8, "a", 1, 1, 1, "")) == \
        "cluster=c model=m tp=1 cp=4 seq=8 runner=a"
    assert key_text(("c", "m", 1, 2, 4, 8, "a", 2, 1, 8, "web#1a2b3c")) == \
        "cluster=c model=m tp=1 pp=2 cp=4 seq=8 runner=a dp=2 micro_batches=8 mix=web#1a2b3c"


def test_report_composes_each_cluster_and_model_once_and_predicts_as_before(monkeypatch, tmp_path):
    """A report of many keys loads each (cluster, model) profile once (a load composes the
    Hydra config), and every key still gets its prediction; an unknown model gets none."""
    from hcp_tune import config
    from hcp_tune.outputs import report

    rows = [r for seq in (4096, 8192, 12288) for r in
            rows_for("t", 1, 2, BASE, seq=seq) + rows_for("t", 2, 1, BASE, seq=seq)]
    rows += rows_for("t", 1, 2, BASE, model="no-such-model") * 2
    calls = []
    real_load = config.load
    monkeypatch.setattr(config, "load", lambda args: calls.append(args) or real_load(args))
    keys = report.summarize(rows, results_dir=tmp_path)
    assert len(keys) == 4
    assert sorted(map(tuple, calls)) == [("cluster=local", "model=no-such-model"),
                                         ("cluster=local", "model=tiny")]
    for k in keys:
        predicted = [s.predicted_s for s in k.layouts]
        if k.key["model"] == "tiny":
            assert k.prediction_label and all(p and p > 0 for p in predicted)
        else:
            assert k.prediction_label == "" and predicted == [None]
