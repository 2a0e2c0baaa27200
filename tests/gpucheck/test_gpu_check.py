"""scripts/gpu_check.sh: the --cpu mode end to end, and the verdict rules (issue 8, item 6)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune.gpucheck import attention
from hcp_tune.gpucheck.__main__ import main as gpu_check_main
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

ROOT = Path(__file__).resolve().parents[2]
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
    # --workdir, relative to the caller: the local executor's job folder, rank 0's log
    assert list((tmp_path / "logs" / "jobs").glob("*/*_0_log.err"))


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
    ok, line = attention.verdict(_spec(), _ok(), attention.GPU)
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
    ok, line = attention.verdict(_spec(), _ok(**change), attention.GPU)
    assert not ok and ": FAIL  " in line and line.endswith("-- " + reason), line


def test_any_failed_layout_makes_the_exit_code_1(monkeypatch, capsys, tmp_path):
    import hcp_tune.engine.launch

    def results(specs, workdir):  # the first layout fails, the others pass
        return [_ok(status=Status.INVALID, error="CP result differs", backend="torch",
                    te_backend="")] + [_ok(backend="torch", te_backend="")] * (len(specs) - 1)

    monkeypatch.setattr(hcp_tune.engine.launch, "run_local_batch", results)
    assert gpu_check_main(["--cpu", "--workdir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "gpu-check [4,1] a2a: FAIL" in out and out.strip().endswith("2/3 layouts pass")


# ---------------------------------------------------------------- the Bridge step

def _bridge_ok(**kw):
    fields = dict(trial_id="b", status=Status.OK, backend="bridge", median_s=0.25,
                  tflops_per_gpu=412.0,
                  verification={"cp_active": {"checked": True, "problems": [], "found": [
                      "rank 0: parallel_state CP group [0, 1, 2, 3], hierarchical groups "
                      "[[0, 1], [0, 2]]; 2 module(s) cp_comm_type=a2a+p2p"]},
                      "lm_loss": [11.9, 11.2, 10.4]})
    fields.update(kw)
    return TrialResult(**fields)


def test_bridge_verdict_passes_with_every_part():
    from hcp_tune.gpucheck.bridge import verdict

    ok, line = verdict(_spec(), _bridge_ok())
    assert ok
    assert line == ("gpu-check bridge [2,2] a2a+p2p: PASS  CP active (rank 0: parallel_state CP "
                    "group [0, 1, 2, 3], hierarchical groups [[0, 1], [0, 2]]) | median step "
                    "0.25 s | 412 TFLOP/s/GPU <= peak 989 | lm loss 11.9 -> 10.4")


@pytest.mark.parametrize("change,reason", [
    (dict(status=Status.INVALID, error="rank 0: x holds no CP group",
          verification={"cp_active": {"checked": True, "problems": ["rank 0: x holds no CP group"]}}),
     "-- rank 0: x holds no CP group"),
    (dict(status=Status.INVALID, tflops_per_gpu=1937.0, error="achieved 1937.0 TFLOP/s"),
     "-- achieved 1937.0 TFLOP/s"),
    (dict(status=Status.FAILED, verification={}, error="EnvironmentProblem: runner=bridge: ..."),
     "CP NOT proven"),
])
def test_bridge_verdict_fails_with_the_reason(change, reason):
    from hcp_tune.gpucheck.bridge import verdict

    ok, line = verdict(_spec(), _bridge_ok(**change))
    assert not ok and "FAIL" in line and reason in line


def test_bridge_specs_are_small_llama_at_cp4(tmp_path):
    from hcp_tune.gpucheck.bridge import build_specs

    a, b = build_specs("dgx-h100", tmp_path)
    assert [(s.a2a, s.p2p, s.comm_type) for s in (a, b)] == [(2, 2, "a2a+p2p"), (1, 4, "p2p")]
    assert a.runner == "bridge" and a.layers == 2 and (a.hidden, a.heads, a.kv_heads) == (4096, 32, 8)
    assert a.expected_groups["a2a"] == [[0, 1], [2, 3]] and a.peak_tflops == 989


def test_cpu_mode_says_the_bridge_step_is_skipped(monkeypatch, capsys, tmp_path):

    monkeypatch.setattr("hcp_tune.engine.launch.run_local_batch",
                        lambda specs, workdir: [_ok(backend="torch", te_backend="") for _ in specs])
    gpu_check_main(["--cpu", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == ("gpu-check bridge: skipped (cpu mode): the Bridge step needs >= 4 GPUs "
                       "and Megatron-Bridge with Transformer Engine")


def test_one_gpu_mode_without_a_gpu_says_so_and_what_it_cannot_check(capsys):
    rc = gpu_check_main(["--one-gpu"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and out[0].startswith("gpu-check: --one-gpu needs a GPU visible to torch")
    assert out[1].startswith("gpu-check one-gpu: not checked (needs >= 4 GPUs): CP communication")


def test_one_gpu_checks_fail_alone_and_each_prints_one_line(tmp_path):
    from hcp_tune.gpucheck import single

    def boom():
        raise RuntimeError("CUDA error: invalid device ordinal\nsecond line")

    got = single.run("dgx-h100", tmp_path, checks=(
        lambda: single._line("binding", True, "local rank 3 -> cuda:0 of 1 visible"), boom,
        single.check_binding))
    assert got[0] == (True, "gpu-check one-gpu binding: PASS  local rank 3 -> cuda:0 of 1 visible")
    assert got[1] == (False, "gpu-check one-gpu boom: FAIL  RuntimeError: CUDA error: invalid "
                             "device ordinal")
    assert got[2] == (False, "gpu-check one-gpu binding: FAIL  no CUDA device visible to torch")
