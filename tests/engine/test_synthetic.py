"""runner=synthetic (issue 36): the real sweep loop on a designed truth. A clear key swept
as a user types it gets the trial count and verdict the rules say; a bad truth file is one
line, exit 2, nothing written; the draws are deterministic and have the stated spread."""
import json
import math
import statistics
import subprocess
import sys

import pytest

from hcp_tune.engine import synthetic
from hcp_tune.errors import InputFileError

from helpers import REPO, rows

TINY = ["cp=8", "seq=1024", "tp=1", "pp=1", "model=tiny", "cluster=local",
        "runner=synthetic", "search.order_by_prediction=false"]


def sweep(tmp_path, truth, *extra, name="truth.json"):
    path = tmp_path / name
    path.write_text(truth if isinstance(truth, str) else json.dumps(truth))
    return subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", *TINY, f"runner.truth={path}",
         f"results_dir={tmp_path / 'results'}", *extra],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)


def layouts(medians, cv=0.01):
    return {"layouts": {str(a): {"median_s": m, "noise": {"kind": "lognormal", "cv": cv}}
                        for a, m in zip((1, 2, 4, 8), medians)}}


def test_a_clear_key_is_settled_with_the_trials_the_rules_give(tmp_path):
    """[1,8] 100 ms, [2,4] 108 ms (inside the 10% prune floor), [4,2] and [8,1] 130 and
    150 ms (beyond it), 1% noise: round one measures each layout once and early stopping
    ends the two slow ones; the look at n = 2 separates [2,4] from [1,8]. So 6 trials:
    [1,8] and [2,4] twice, the slow two once each (pruned), and a settled pick of [1,8]."""
    r = sweep(tmp_path, layouts([0.100, 0.108, 0.130, 0.150]), "runner.seed=7")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(tmp_path / "results")
    per = {a: sorted(x["status"] for x in got if x["a2a"] == a) for a in (1, 2, 4, 8)}
    assert per == {1: ["ok", "ok"], 2: ["ok", "ok"], 4: ["pruned"], 8: ["pruned"]}
    assert all(x["runner"] == "synthetic" and x["verified"] for x in got if x["status"] == "ok")
    rec = json.loads(subprocess.run(
        [sys.executable, "-m", "hcp_tune", "recommend", "cluster=local", "model=tiny", "cp=8",
         "seq=1024", "tp=1", "pp=1", "runner=synthetic", "format=json",
         f"results_dir={tmp_path / 'results'}"], capture_output=True, text=True,
        cwd=tmp_path).stdout)["recommendation"]
    assert (rec["a2a"], rec["verdict"], rec["runner"]) == (1, "settled", "synthetic")
    assert "stopped early" in " ".join(r.stdout.split())  # the pruned two are named


def test_the_same_seed_draws_the_same_sweep_and_another_seed_does_not(tmp_path):
    truth = layouts([0.100, 0.103, 0.106, 0.115], cv=0.02)
    a, b, c = (tmp_path / n for n in "abc")
    for folder, seed in ((a, 1), (b, 1), (c, 2)):
        folder.mkdir()
        assert sweep(folder, truth, f"runner.seed={seed}").returncode == 0
    med = [sorted(x["median_s"] for x in rows(f / "results") if x["status"] == "ok")
           for f in (a, b, c)]
    assert med[0] == med[1] and med[0] != med[2]


@pytest.mark.parametrize("body,says", [
    ({"layouts": {"1": {"median_s": 0.1}, "2": {"median_s": 0.1}, "4": {"median_s": 0.1}}},
     "no layout for a2a size(s) 8 of cp=8"),
    ({"layouts": {a: {"median_s": 0.1, "noise": {"kind": "lognormal", "cv": -0.01}}
                  for a in "1248"}}, "layouts.1.noise.cv=-0.01: expected a number >= 0"),
    ({"layouts": {a: {"median_s": 0.1, "noise": {"kind": "gamma", "cv": 0.01}}
                  for a in "1248"}}, "layouts.1.noise.kind='gamma': expected one of"),
    ({"layouts": {a: {"median_s": "fast"} for a in "1248"}}, "median_s='fast': expected a number"),
    ("layouts: [1, 2", "not valid YAML"),
    ({"layout": {}}, "expected a mapping with 'layouts'"),
])
def test_a_bad_truth_file_is_one_line_exit_2_and_nothing_written(tmp_path, body, says):
    name = "truth.yaml" if isinstance(body, str) else "truth.json"
    r = sweep(tmp_path, body, name=name)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()


def test_the_sweep_asks_for_a_truth_file(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hcp_tune", "sweep", *TINY,
                        f"results_dir={tmp_path / 'results'}"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "runner=synthetic needs runner.truth=FILE" in r.stderr


@pytest.mark.parametrize("kind,extra", [("lognormal", {}), ("t3", {}),
                                         ("bimodal", {"p": 0.3, "shift": 0.06})])
def test_each_noise_kind_has_the_spread_it_states(kind, extra):
    """cv is the sd of a trial's log deviation for every kind (t3 scaled by 1/sqrt(3));
    bimodal puts a share p of trials log(1 + shift) higher."""
    truth = synthetic.parse_truth({"layouts": {"1": {"median_s": 1.0, "noise": {
        "kind": kind, "cv": 0.02, "step_cv": 0.0, **extra}}}})
    logs = [math.log(synthetic.draw_steps(truth, 1, seed=5, key="k", number=i, position=0,
                                          steps=1)[0]) for i in range(4000)]
    if kind == "bimodal":
        slow = [x for x in logs if x > math.log(1.06) / 2]
        assert len(slow) / len(logs) == pytest.approx(0.3, abs=0.03)
    else:
        assert statistics.pstdev(logs) == pytest.approx(0.02, rel=0.1)
        assert statistics.median(logs) == pytest.approx(0.0, abs=0.002)


def test_the_session_shifts_every_layout_of_a_key_alike_and_drift_grows_with_position():
    truth = synthetic.parse_truth({"layouts": {"1": {"median_s": 1.0, "noise": {"cv": 0.0, "step_cv": 0.0}},
                                               "2": {"median_s": 2.0, "noise": {"cv": 0.0, "step_cv": 0.0}}},
                                   "session": {"shift_sd": 0.05, "drift": 0.05}})
    one = {a: synthetic.draw_steps(truth, a, seed=1, key="k", number=0, position=0, steps=1)[0]
           for a in (1, 2)}
    assert one[2] / one[1] == pytest.approx(2.0) and one[1] != pytest.approx(1.0)
    last = synthetic.draw_steps(truth, 1, seed=1, key="k", number=9, position=1, steps=1)[0]
    assert last / one[1] == pytest.approx(1.05)


def test_parse_truth_names_the_key_of_an_unknown_field():
    with pytest.raises(InputFileError, match=r"layouts.2: unknown key\(s\) \['median'\]"):
        synthetic.parse_truth({"layouts": {"2": {"median": 1.0}}}, "t.yaml")


def test_trial_refuses_the_synthetic_runner_in_one_line():
    r = subprocess.run([sys.executable, "-m", "hcp_tune", "trial", "cp=8", "seq=1024",
                        "model=tiny", "cluster=local", "runner=synthetic", "a2a=2"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "runner=synthetic: trial measures one layout" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
