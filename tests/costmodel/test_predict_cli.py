"""``predict`` as a user meets it, and the ordering / skipping / runner choice sweeps use."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.costmodel import predict
from hcp_tune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "hcp_tune", *args], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=120,
    )


def test_predict_json_is_best_first_and_labelled():
    r = run("predict", "cp=8", "seq=131072", "tp=1", "pp=1", "model=llama3-8b",
            "cluster=dgx-h200", "format=json")  # 141 GiB: every tp=1 layout fits
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["label"] == "predicted (uncalibrated defaults)"
    assert out["params_source"] == "uncalibrated defaults"
    rows = out["candidates"]
    assert sorted(tuple(c["sizes"]) for c in rows) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert [c["rank"] for c in rows] == [1, 2, 3, 4]
    times = [c["predicted_step_time_s"] for c in rows]
    assert times == sorted(times) and rows[0]["vs_best"] == 1.0
    for c in rows:
        assert c["label"].startswith("predicted")
        b = c["breakdown_s"]
        assert set(b) == {"compute_s", "exposed_a2a_s", "exposed_p2p_s", "other_s",
                          "recompute_s", "bubble_s", "pp_send_s"}
        assert b["recompute_s"] == b["bubble_s"] == b["pp_send_s"] == 0  # pp=1, no recompute
        assert sum(b.values()) == pytest.approx(c["predicted_step_time_s"])
        t = c["terms_s"]  # the terms of compute, exposed a2a and exposed p2p
        assert sum(t.values()) == pytest.approx(b["compute_s"] + b["exposed_a2a_s"]
                                                + b["exposed_p2p_s"])
        assert (t["a2a_messages_s"] > 0) == (c["a2a"] > 1)
        assert c["memory_gib"]["total_gib"] == pytest.approx(c["predicted_memory_gib"])
    assert out["rejected"] == []


def test_predict_lists_rejected_layouts_with_reasons_and_no_numbers():
    r = run("predict", "cp=16", "tp=2", "seq=[8192,131072]", "format=json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rej = out["rejected"]
    assert {tuple(x["sizes"]) for x in rej} == {(8, 2), (16, 1)}
    assert all("predicted_step_time_s" not in x and x["reasons"] for x in rej)
    first = [c for c in out["candidates"] if c["rank"] == 1]
    assert [(c["seq"], c["sizes"]) for c in first] == [(8192, [4, 4]), (131072, [4, 4])]


def test_predict_table_says_predicted_and_which_params():
    r = run("predict", "cp=4", "seq=8192", "model=tiny", "cluster=local")
    assert r.returncode == 0, r.stderr
    assert "PREDICTED (cost model, not measured)" in r.stdout
    assert "params: uncalibrated defaults" in r.stdout
    assert "CPU nominal 10 GFLOP/s/core" in r.stdout


def test_predict_bad_override_is_one_line_exit_2():
    r = run("predict", "cp=8", "seq=1000")
    assert r.returncode == 0  # illegal seq: every layout is rejected, with the fix
    r = run("predict", "cp=eight")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("hcp-tune: error: cp=")


def test_predict_does_not_import_torch():
    code = ("import sys, contextlib, io\n"
            "from hcp_tune.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['predict', 'cp=8', 'seq=131072', 'format=json'])\n"
            "assert rc == 0, rc\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ------------------------------------------------------------------ ordering and skipping

def test_ordering_is_fastest_first_per_key():
    cfg = config.load(["cp=16", "tp=2", "seq=[8192,131072]"])
    ordered = predict.ordering(cfg)
    assert all(c.kept for c, _ in ordered)
    for seq in (8192, 131072):
        times = [p.step_time_s for c, p in ordered if c.seq == seq]
        assert len(times) == 3 and times == sorted(times)


def test_skip_is_off_by_default():
    cfg = config.load(["cp=16", "tp=2", "seq=8192"])
    assert cfg.search.skip_predicted_slower_than is None
    assert predict.skip_slower_than(predict.ordering(cfg), None) == []


def test_skip_slower_than_factor_records_predicted_numbers():
    cfg = config.load(["cp=16", "tp=2", "seq=8192"])
    skipped = predict.skip_slower_than(predict.ordering(cfg), 1.5)
    assert [(s["a2a"], s["p2p"]) for s in skipped] == [(1, 16)]
    s = skipped[0]
    assert s["status"] == "skipped" and s["predicted"]["label"].startswith("predicted")
    assert "> skip_predicted_slower_than=1.5" in s["reason"]


@pytest.mark.parametrize("factor", [0.5, "fast", True])
def test_skip_factor_below_one_is_refused_at_load_with_the_fix(factor):
    with pytest.raises(ConfigError, match=r"search.skip_predicted_slower_than=.*: expected null "
                                          r"or a number >= 1 \(e.g. 1.5 skips"):
        config.load([f"search.skip_predicted_slower_than={str(factor).lower()}"])


def test_layouts_that_do_not_fit_are_never_ranked_and_the_smallest_fitting_change_is_named():
    r = run("predict", "cp=8", "seq=131072", "tp=1", "pp=1", "model=llama3-8b",
            "cluster=dgx-h100", "format=json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert all(not c["fits_memory"] and c["rank"] is None for c in out["candidates"])
    (a,) = out["fit_advice"]
    assert a["change"].startswith("recompute=full") and a["predicted_memory_gib"] <= 80
    assert "model.recompute_granularity=full" in a["bridge_overrides"]
    table = run("predict", "cp=8", "seq=131072", "tp=1", "pp=1", "cluster=dgx-h100")
    assert "smallest change that fits: recompute=full" in " ".join(table.stdout.split())


def test_the_readme_main_command_follows_the_bridge_recipe_and_fits():
    r = run("predict", "cp=8", "seq=131072", "format=json")  # llama3-8b on dgx-h100
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "llama3_8b_128k_pretrain_config" in out["notes"][0]
    assert out["pp"] == 2 and {c["tp"] for c in out["candidates"]} == {4}
    assert out["candidates"] and all(c["fits_memory"] for c in out["candidates"])
    assert out["fit_advice"] == []


# a key inside the band's domain (8x A100 NVLink, one node, attention: issue 28)
H200 = ["cp=8", "seq=32768", "tp=1", "pp=1", "model=llama3-8b", "cluster=dgx-a100"]


@pytest.mark.parametrize("command", [["predict"], ["sweep", "runner=model"]])
def test_predicted_tables_print_the_group_and_a_command_that_plans_exactly_it(command):
    import shlex

    from hcp_tune.space import plan

    group = json.loads(run(*command, *H200, "format=json").stdout)["close_groups"][0]
    r = run(*command, *H200, env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if group["confident"]:
        assert any(x.startswith("tp=1 seq=32768: confident pick") for x in lines)
        return
    head = next(i for i, x in enumerate(lines) if x.startswith("tp=1 seq=32768: too close"))
    cmd = next(i for i in range(head, len(lines)) if lines[i].startswith("  python -m "))
    assert "within the model's error band" in " ".join(x.strip() for x in lines[head:cmd])
    assert all(len(x) <= 100 for x in lines[head:cmd])
    printed = lines[cmd].strip()  # the command on one line, however narrow the terminal
    assert printed == group["settle_command"]
    cfg = config.load(shlex.split(printed)[4:])
    assert sorted(c.layout.a2a for c in plan.candidates(cfg) if c.kept) == \
        sorted(group["a2a_sizes"])
    assert any(x.startswith("error band: pooled band of the defaults") for x in lines)


def test_recommend_prediction_carries_the_group_and_the_band(tmp_path):
    r = run("recommend", *H200, f"results_dir={tmp_path}", "format=json")
    assert r.returncode == 3
    ans = json.loads(r.stdout)
    assert ans["close_group"]["a2a_sizes"][0] == ans["prediction"]["a2a"]
    assert ans["band"]["q"] == 0.9
    r = run("recommend", *H200, f"results_dir={tmp_path}")
    assert "PREDICTED, not measured" in r.stdout
    assert "tp=1 seq=32768: " in r.stdout and "error band:" in r.stdout


def test_the_main_commands_predicted_table_fits_100_columns_with_readable_units():
    """`sweep cp=8 seq=131072` on a machine without GPU or SLURM predicts (runner=auto);
    runner=model is the same table anywhere. Step times of minutes print in s, not as
    `381,158.3` ms; the per-term breakdown is behind format=json."""
    import re

    r = run("sweep", "cp=8", "seq=131072", "runner=model")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "tp"])
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].strip())
    table = lines[start:end]
    assert len(table) >= 4  # header, rule, one row per kept layout ([1,8] and [2,4])
    assert all(len(line) <= 100 for line in table), "\n".join(table)
    for row in table[2:]:
        step = re.search(r"\] (?:p2p|a2a\+p2p|a2a)\s+(\S+ \S+)", row).group(1)
        assert re.fullmatch(r"\d+(\.\d+)? s", step), row  # seconds-long steps in s
        assert not re.search(r"\d,\d{3}", row), row  # no thousands separators
