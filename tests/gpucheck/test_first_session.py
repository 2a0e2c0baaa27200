"""scripts/gpu_check.sh --first-session / --dry (issues 30, 38): one 8-GPU node in under ten
minutes, steps side by side on GPUs 0-3 and 4-7, one deadline, a line per step and a summary."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from hcp_tune.gpucheck import checks, schedule, session
from hcp_tune.gpucheck.__main__ import summary
from hcp_tune.spec import Status, TrialResult

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["imports", "one-gpu", "bridge-32k", "mask-on-32k", "guard-cp4", "fit-pp2", "negatives",
         "gpu-per-task", "tp2-cp4", "pp2-cp4", "recipe-64k"]


def test_the_dry_plan_lists_every_step_with_its_gpus_its_estimate_and_a_total_under_ten_minutes(
        tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, COLUMNS="100")
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry", "--workdir",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[1] == f"gpu-check: results in {tmp_path}"
    assert all(len(line) <= 100 for line in out[2:]), max(out[2:], key=len)
    steps = [ln for ln in out if ln.startswith("step ")]
    assert [ln.split()[2] for ln in steps] == ORDER
    assert all(re.search(r"\(GPUs [^,]+, estimate \d+ s, at \d+-\d+ s\)", ln) for ln in steps)
    text = " ".join(ln.strip() for ln in out)
    assert "guard-cp4 (GPUs 4-7," in text and "fit-pp2 (GPUs 0-3," in text  # side by side
    assert "gpu-check-tp2-cp4: world 8 (tp2 cp4 pp1) [2,2] a2a+p2p" in text
    assert "gpu-check-pp2-cp4: world 8 (tp1 cp4 pp2) [2,2] a2a+p2p seq 8192 m 2" in text
    assert ("gpu-check-recipe-64k: world 8 (tp1 cp4 pp2) [2,2] a2a+p2p seq 65536 m 2, recipe "
            "llama3_8b_128k_pretrain_config") in text and "model.num_layers=4" in text
    assert all(f"gpu-check-fit2-m{m}: world 4 (tp1 cp2 pp2)" in text for m in (2, 4, 6))
    total = int(re.search(r"gpu-check: estimate (\d+) s", text).group(1))
    assert 0 < total < 600 and "deadline 600 s" in text
    assert out[-1] == f"gpu-check: dry: {len(ORDER)}/{len(ORDER)} steps built"


def test_four_gpu_steps_take_a_whole_half_and_eight_gpu_steps_the_node():
    assert schedule.assign(set(range(8)), 4, 8) == [0, 1, 2, 3]
    assert schedule.assign({1, 2, 3, 4, 5, 6, 7}, 4, 8) == [4, 5, 6, 7]  # GPU 0 busy
    assert schedule.assign({1, 2, 3, 5, 6, 7}, 4, 8) is None  # no whole half free
    assert schedule.assign(set(range(8)) - {3}, 8, 8) is None
    assert schedule.assign({2, 5}, 1, 8) == [2] and schedule.assign(set(), 0, 8) == []
    steps = [SimpleNamespace(name=n, gpus=g, estimate_s=e)
             for n, g, e in (("a", 4, 100), ("b", 4, 50), ("c", 8, 10), ("d", 1, 20))]
    slots = {s.name: (s.gpus, s.start_s, s.end_s) for s in schedule.simulate(steps, 8)}
    assert slots["a"] == ([0, 1, 2, 3], 0, 100) and slots["b"] == ([4, 5, 6, 7], 0, 50)
    assert slots["d"] == ([4], 50, 70)  # a later 1-GPU step fills the free half
    assert slots["c"] == (list(range(8)), 100, 110)
    assert "c" not in {s.name for s in schedule.simulate(steps, 4)}  # needs 8


STEP = """
import json, os, sys, time
name, folder = sys.argv[1], sys.argv[2]
if name == "hang":
    time.sleep(120)  # the workload: a step that never ends in time
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "step.json"), "w") as f:
    json.dump({"ok": True, "line": "saw GPUs " + os.environ["CUDA_VISIBLE_DEVICES"]}, f)
"""


def test_steps_run_on_their_gpus_and_the_deadline_stops_what_it_started(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(STEP)
    steps = [SimpleNamespace(name=n, gpus=g) for n, g in
             (("quick", 1, ), ("hang", 2), ("late", 2), ("big", 4))]
    seen: list[str] = []
    outcomes = schedule.run(steps, 2, tmp_path, "x", deadline_s=3.0, out=seen.append,
                            command=lambda name, wd, _c: [sys.executable, str(script), name,
                                                          str(wd / name)])
    got = {o.name: (o.state, o.text) for o in outcomes}
    assert got["quick"] == ("PASS", "saw GPUs 0")
    assert got["hang"][0] == "FAIL" and got["hang"][1].startswith("stopped at the 3 s deadline")
    assert got["late"] == ("NOT RUN", "the 3 s deadline passed before it could start")
    assert got["big"] == ("SKIPPED", "needs 4 GPUs, 2 here")
    assert "gpu-check hang: started on GPUs 0-1 at " in "\n".join(seen)
    lines = summary(outcomes, tmp_path, 2, 3.5, 3.0, 500)
    assert lines[0].startswith("----- gpu-check first-session summary (paste into a bug report)")
    assert "steps: 1 PASS, 1 FAIL, 1 SKIPPED, 1 NOT RUN; wall 4 s of the 3 s deadline" in lines[3]
    assert any(ln.startswith("PASS    quick [GPUs 0, ") for ln in lines)


def test_a_step_without_the_stack_writes_its_line_without_building(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "stack_missing", lambda: "Megatron-Bridge not importable")
    ok, line = session.run_step("tp2-cp4", tmp_path, "dgx-h100")
    assert not ok and line == "not run: Megatron-Bridge not importable"
    assert json.loads((tmp_path / "tp2-cp4" / "step.json").read_text())["line"] == line


def _res(median, steps=None, status=Status.OK):
    return TrialResult(trial_id="t", status=status, median_s=median,
                       step_times_s=steps or [median * f for f in (0.99, 1.0, 1.01)])


def test_the_fit_step_passes_a_line_and_fails_a_kink(tmp_path):
    ctx = session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=4)
    specs = session.BY_NAME["fit-pp2"].build(ctx)
    assert [s.micro_batches for s in specs] == [2, 4, 6]  # the sweep's pp, 2pp, 3pp
    ok, line = checks.fit_line(specs, [_res(1.2), _res(1.4), _res(1.6)])
    assert ok and "step = 1 s + 0.1 s * m" in line and "a line within the noise" in line
    ok, line = checks.fit_line(specs, [_res(1.2), _res(1.7), _res(1.8)])
    assert not ok and "does not fit the runs at m=2, 4, 6" in line


def test_the_recorder_is_compared_with_bridges_iteration_lines(tmp_path):
    ctx = session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=1)
    (spec,) = session.BY_NAME["bridge-32k"].build(ctx)
    folder = tmp_path / spec.trial_id / "jobs"
    folder.mkdir(parents=True)
    lines = [f" [2026-12-04 15:00:0{i}] iteration {i:8d}/       7 | consumed samples: {i:12d} | "
             f"elapsed time per iteration (ms): {ms:.1f} | lm loss: 1.0E+01 |"
             for i, ms in enumerate([9000, 900, 1000, 1000, 1000, 1000, 1000], 1)]
    (folder / "rank0.log").write_text("\n".join(lines))
    ok, line = checks.recorder_vs_log(ctx, spec, _res(0.97))
    assert ok and "Bridge's elapsed time per iteration 1 s (-3.0%" in line
    assert not checks.recorder_vs_log(ctx, spec, _res(1.10))[0]  # above Bridge's own timer


def test_a_deadline_that_is_not_positive_is_one_line_and_exit_2(capsys):
    import pytest

    from hcp_tune.gpucheck.__main__ import main

    with pytest.raises(SystemExit) as err:
        main(["--first-session", "--deadline-s", "0"])
    assert err.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpu_check.sh: error: --deadline-s=0: expected seconds > 0, e.g. 600")
