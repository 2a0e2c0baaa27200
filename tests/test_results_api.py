"""``hcp_tune.results``, the notebook's API: typed DataFrames over a results folder (and a
team's database) that agree with ``recommend`` and ``regress`` on the same folder.

The folder is drawn by runner=synthetic (the real sweep loop, no GPU, about a second a
sweep): env tag ``base`` swept adaptively, ``cand`` with three trials a layout."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from hcp_tune import results

from helpers import REPO

KEY = ["cp=8", "seq=1024", "tp=1", "pp=1", "model=tiny", "cluster=local", "runner=synthetic"]
TRUTH = {"layouts": {str(a): {"median_s": m, "noise": {"kind": "lognormal", "cv": 0.01}}
                     for a, m in ((1, 0.100), (2, 0.104), (4, 0.130), (8, 0.150))}}


def hcp(*args):
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def sweep(res, truth, tag, *extra):
    r = hcp("sweep", *KEY, "search.order_by_prediction=false", f"runner.truth={truth}",
            "runner.seed=3", f"env_tag={tag}", f"results_dir={res}", *extra)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebook")
    truth = root / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    for tag in ("base", "cand"):
        sweep(root / "results", truth, tag, "search.adaptive=false", "search.repeats=3")
    return root / "results"


def recommend(res, tag) -> dict:
    r = hcp("recommend", *KEY, f"env_tag={tag}", "format=json", f"results_dir={res}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["recommendation"]


def test_trials_have_typed_columns(folder):
    t = results.folder(folder).trials()
    dtypes = t.dtypes.astype(str)
    assert {dtypes[c] for c in ("tp", "cp", "seq", "a2a", "p2p", "steps")} == {"Int64"}
    assert {dtypes[c] for c in ("median_s", "p10_s", "p90_s", "wall_s")} == {"float64"}
    assert dtypes["verified"] == "boolean" and dtypes["status"] == "string"
    assert pd.api.types.is_datetime64_any_dtype(t["started_at"])
    assert pd.api.types.is_datetime64_any_dtype(t["finished_at"])
    ok = t[t["status"] == "ok"]
    assert len(ok) > 0 and (ok["finished_at"] >= ok["started_at"]).all()
    for _, trial in ok.iterrows():  # step times as a list of numbers, one per step
        assert isinstance(trial["step_times_s"], list)
        assert len(trial["step_times_s"]) == trial["steps"]
        assert all(isinstance(x, float) for x in trial["step_times_s"])
        assert isinstance(trial["fingerprint"], dict) and isinstance(trial["phases_s"], dict)
    assert list(ok["layout"].unique()) == [f"[{a},{8 // a}]" for a in sorted(ok["a2a"].unique())]


@pytest.mark.parametrize("tag", ["base", "cand"])
def test_recommendations_agree_with_recommend(folder, tag):
    rec = recommend(folder, tag)
    frame = results.folder(folder).recommendations(env_tag=tag, cp=8)
    assert len(frame) == 1
    got = frame.iloc[0]
    for column, want in rec.items():
        if want is None:
            assert pd.isna(got[column]), column
        elif isinstance(want, float):
            assert math.isclose(got[column], want, rel_tol=1e-12), column
        else:
            assert got[column] == want, column


@pytest.mark.parametrize("tag", ["base", "cand"])
def test_trials_agree_with_recommend(folder, tag):
    """The best layout's figure is the median of its verified ok trials' medians, over
    the trials the frame holds; every stored trial of the key is there."""
    rec = recommend(folder, tag)
    t = results.folder(folder).trials(env_tag=tag)
    assert len(t) == rec["trials"] and (t["status"] == "ok").sum() == rec["ok_trials"]
    best = t[(t["a2a"] == rec["a2a"]) & (t["status"] == "ok") & t["verified"]]
    assert len(best) == rec["n_trials"]
    assert math.isclose(best["median_s"].median(), rec["median_s"], rel_tol=1e-12)


def test_steps_are_one_row_per_measured_step(folder):
    f = results.folder(folder)
    steps = f.steps(env_tag="cand")
    ok = f.trials(env_tag="cand", status="ok", times=False)
    assert len(steps) == ok["steps"].sum() and steps["step_time_s"].dtype == "float64"
    first = ok.iloc[0]
    mine = steps[steps["trial_id"] == first["trial_id"]]
    assert list(mine["step"]) == list(range(first["steps"]))
    assert list(mine["step_time_s"]) == first["step_times_s"]


def test_regress_frame_agrees_with_regress(folder):
    r = hcp("regress", "baseline=base", "candidate=cand", f"results_dir={folder}")
    counts = re.search(r"no confirmed change in (\d+) key/layout\(s\); (\d+) inconclusive",
                       " ".join(r.stdout.split()))
    assert r.returncode == 4 and counts, r.stdout
    frame = results.folder(folder).regress("base", "cand")
    assert len(frame) == int(counts.group(1))
    assert (frame["verdict"] == "inconclusive").sum() == int(counts.group(2))
    assert str(frame["ratio"].dtype) == "float64" and str(frame["needed"].dtype) == "Int64"
    both = results.folder(folder).trials(status="ok", times=False)
    assert set(frame["layout"]) <= set(both[both["env_tag"] == "base"]["layout"])


def test_filters(folder):
    f = results.folder(folder)
    everything = f.trials(times=False)
    assert set(f.trials(env_tag="cand", times=False)["env_tag"]) == {"cand"}
    assert len(f.trials(env_tag=["base", "cand"], times=False)) == len(everything)
    assert len(f.trials(cp=4, times=False)) == 0 and len(f.recommendations(cp=4)) == 0
    pruned = f.trials(status=["pruned"], times=False)
    assert set(pruned["status"]) <= {"pruned"}
    with pytest.raises(results.ResultsError, match=r"^tag=: not a filter; .*env_tag"):
        f.trials(tag="cand")


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(results.ResultsError, match="no such results folder"):
        results.folder(tmp_path / "nothing")


@pytest.mark.postgres
def test_a_database_backed_folder_reads_the_same_trials(postgres_db, tmp_path):
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(TRUTH))
    sweep(tmp_path / "alice", truth, "base", f"search.storage={postgres_db}")
    mine = results.folder(tmp_path / "alice").trials()
    team = results.folder(tmp_path / "view", storage=postgres_db).trials()
    assert sorted(team["trial_id"]) == sorted(mine["trial_id"]) and len(team) > 0
    assert team.set_index("trial_id")["median_s"].equals(mine.set_index("trial_id")["median_s"])
    assert team["finished_at"].notna().all()


def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/guides/notebooks.md's worked example, as a reader runs it: its shell block
    (the sweep), then its Python blocks in order; the plotting one where matplotlib is."""
    page = (REPO / "docs" / "guides" / "notebooks.md").read_text()
    shell = re.findall(r"```bash\n(.*?)```", page, re.S)
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)[1:]  # past the opening snippet
    r = subprocess.run(["bash", "-euc", shell[0].replace("python -m", f"{sys.executable} -m")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for block in blocks:
        if "matplotlib" in block:
            if importlib.util.find_spec("matplotlib") is None:
                continue  # plotting stays optional
            __import__("matplotlib").use("Agg")
        exec(compile(block, "notebooks.md", "exec"), scope)
    assert list(scope["spread"].index) == sorted(scope["ranking"].index)


def test_a_comparison_regress_refuses_is_one_line(folder):
    f = results.folder(folder)
    with pytest.raises(results.ResultsError, match="are the same tag"):
        f.regress("base", "base")
    with pytest.raises(results.ResultsError, match="unknown env tag"):
        f.regress("base", "nightly")
