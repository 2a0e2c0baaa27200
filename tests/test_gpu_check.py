"""scripts/gpu_check.sh: the --cpu mode end to end, and the verdict rules (issue 8, item 6)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import gpucheck
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^gpu-check \[(\d),(\d)\] (a2a|p2p|a2a\+p2p): PASS  groups match \| "
                  r"numerics pass \(worst [0-9.e+-]+ <= 0\.025, vs no-CP bf16\) \| "
                  r"[0-9.e+-]+ TFLOP/s/GPU \(no peak in this profile\) \| backend torch$")


@pytest.mark.multiproc
def test_cpu_mode_prints_one_passing_verdict_per_layout_from_another_folder(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu",
                           "--workdir", "logs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    verdicts = [ln for ln in out if ln.startswith("gpu-check [")]
    assert [LINE.match(ln).group(1, 2) for ln in verdicts] == [("4", "1"), ("2", "2"),
                                                               ("1", "4")], verdicts
    assert out[-1] == "gpu-check: 3/3 layouts pass"
    assert (tmp_path / "logs" / "rank0.log").exists()  # --workdir, relative to the caller


def test_bad_arguments_exit_2_with_one_line(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--seq", "100"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpu-check: error: layout [4,1] is rejected")


def _spec(**kw):
    return TrialSpec(trial_id="t", a2a=2, p2p=2, seq=16384, heads=32, kv_heads=8,
                     head_dim=128, peak_tflops=989.0, **kw)


def _ok(**kw):
    fields = dict(trial_id="t", status=Status.OK, backend="te",
                  te_backend="FusedAttention (sub-backend 1)", tflops_per_gpu=321.0,
                  verification={"groups": {"match": True, "problems": []},
                                "numerics": {"passed": True, "errors": {"out": 0.004},
                                             "tolerance": 0.035, "reference": "no-CP bf16"}})
    fields.update(kw)
    return TrialResult(**fields)


def test_gpu_verdict_names_every_check():
    ok, line = gpucheck.verdict(_spec(), _ok(), gpucheck.GPU)
    assert ok and line == (
        "gpu-check [2,2] a2a+p2p: PASS  groups match | numerics pass (worst 0.004 <= 0.035, "
        "vs no-CP bf16) | 321 TFLOP/s/GPU <= peak 989 | backend te: FusedAttention (sub-backend 1)")


@pytest.mark.parametrize("change, reason", [
    (dict(status=Status.INVALID, error="groups differ: x",
          verification={"groups": {"match": False, "problems": ["groups differ: x"]}}),
     "groups differ: x"),
    (dict(status=Status.INVALID, error="CP result differs",
          verification={"groups": {"match": True}, "numerics": {
              "passed": False, "errors": {"dv": 2.5}, "tolerance": 0.025}}),
     "CP result differs"),
    (dict(status=Status.INVALID, tflops_per_gpu=1937.0, error="achieved 1937.0 TFLOP/s"),
     "achieved 1937.0 TFLOP/s"),
    (dict(backend="torch", te_backend="", notes=["fallback"]),
     "backend torch ran, te was expected"),
    (dict(te_backend=""), "TE's selected backend was not recorded (NVTE_DEBUG log not seen)"),
    (dict(status=Status.FAILED, failure_class=FailureClass.ENVIRONMENT, backend="",
          error="EnvironmentProblem: no CUDA", verification={}),
     "groups not checked"),
])
def test_gpu_verdict_fails_with_the_first_reason(change, reason):
    ok, line = gpucheck.verdict(_spec(), _ok(**change), gpucheck.GPU)
    assert not ok and ": FAIL  " in line and line.endswith("-- " + reason), line


def test_any_failed_layout_makes_the_exit_code_1(monkeypatch, capsys, tmp_path):
    import hcp_tune.launch

    def results(specs, workdir):  # the first layout fails, the others pass
        return [_ok(status=Status.INVALID, error="CP result differs", backend="torch",
                    te_backend="")] + [_ok(backend="torch", te_backend="")] * (len(specs) - 1)

    monkeypatch.setattr(hcp_tune.launch, "run_local_batch", results)
    assert gpucheck.main(["--cpu", "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "gpu-check [4,1] a2a: FAIL" in out and out.strip().endswith("2/3 layouts pass")
