"""scripts/gpu_check.sh --first-session / --dry (issue 30): the first GPU session's checks in
order, each saying what it runs and proves; the dry mode walks the whole sequence on CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hcp_tune.gpucheck import session
from hcp_tune.spec import Status, TrialResult

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["imports", "one-gpu", "bridge-32k-mask", "recorder-vs-log", "fit-pp1", "guard-cp4",
         "negatives", "fit-pp2", "srun-one-gpu-per-task"]


def test_the_dry_mode_walks_every_step_on_cpu_and_builds_what_it_would_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, COLUMNS="100")
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry", "--workdir",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[1] == f"gpu-check: logs in {tmp_path}"
    assert all(len(line) <= 100 for line in out[2:]), max(out[2:], key=len)
    steps = [ln.split()[2] for ln in out if ln.startswith("step ")]
    assert steps == ORDER
    text = " ".join(ln.strip() for ln in out)
    assert "gpu-check-mask-off: world 1" in text and "gpu-check-mask-on: world 1" in text
    assert text.index("create_attention_mask=False") < text.index("create_attention_mask=True")
    assert "gpu-check-swapped-sizes: world 8 (tp1 cp8 pp1) [2,4]" in text
    assert "hierarchical sizes [4, 2]" in text  # the planted swap
    assert all(f"gpu-check-fit2-m{m}: world 4 (tp1 cp2 pp2)" in text for m in (2, 6, 18))
    assert "--gpus-per-task=1" in text and "first-session imports: PASS" in text
    assert out[-1] == ("gpu-check: 1/1 first-session checks pass (dry: the other steps were "
                       "built, not run)")


def test_without_gpus_every_gpu_step_is_skipped_and_said(tmp_path):
    seen: list[str] = []
    lines = session.run(session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=0), dry=False,
                        out=seen.append)
    assert [ok for ok, _ in lines] == [True]  # the imports
    skipped = [ln.split()[2].rstrip(":") for ln in seen if "SKIPPED" in ln]
    assert skipped == ORDER[1:]


def test_the_srun_step_sweeps_with_overrides_the_config_accepts():
    from hcp_tune import config

    cfg = config.load(session.srun_command("dgx-h100")[4:])
    assert cfg.executor.extra_srun == ["--gpus-per-task=1", "--gpu-bind=single"]


def _res(median, steps=None, status=Status.OK):
    return TrialResult(trial_id="t", status=status, median_s=median,
                       step_times_s=steps or [median * f for f in (0.99, 1.0, 1.01)])


def test_the_fit_step_passes_a_line_and_fails_a_kink(tmp_path):
    ctx = session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=1)
    specs = session.STEPS[4].build(ctx)
    ok, line = session._fit_line("fit-pp1", specs, [_res(1.1), _res(1.3), _res(1.9)])
    assert ok and "step = 1 s + 0.1 s * m" in line and "a line within the noise" in line
    ok, line = session._fit_line("fit-pp1", specs, [_res(1.1), _res(1.6), _res(1.9)])
    assert not ok and "does not fit the runs at m=1, 3, 9" in line


def test_the_recorder_is_compared_with_bridges_iteration_lines(tmp_path):
    ctx = session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=1)
    spec = session.STEPS[2].build(ctx)[0]
    folder = tmp_path / spec.trial_id / "jobs"
    folder.mkdir(parents=True)
    lines = [f" [2026-12-04 15:00:0{i}] iteration {i:8d}/       7 | consumed samples: {i:12d} | "
             f"elapsed time per iteration (ms): {ms:.1f} | lm loss: 1.0E+01 |"
             for i, ms in enumerate([9000, 900, 1000, 1000, 1000, 1000, 1000], 1)]
    (folder / "rank0.log").write_text("\n".join(lines))
    ctx.results["mask"] = (spec, _res(0.97))
    ((ok, line),) = session.check_recorder(ctx, [])
    assert ok and "Bridge's elapsed time per iteration 1 s (-3.0%" in line
    ctx.results["mask"] = (spec, _res(1.10))  # above Bridge's own loop timer: wrong
    assert not session.check_recorder(ctx, [])[0][0]


def test_on_one_gpu_without_the_stack_bridge_steps_say_so_and_bigger_steps_are_skipped(
        tmp_path, monkeypatch):
    """What a lent H200 with torch only printed before the fix: the 4-GPU 'negatives' step was
    built (and FAILed) on 1 GPU, and each Bridge step failed on an orchestrator import
    ('No module named submitit') instead of naming the missing Bridge stack."""
    monkeypatch.setattr(session, "_stack_missing", lambda: "Megatron-Bridge not importable")

    def no_build(ctx, *a, **k):
        raise AssertionError("a step that cannot run was built")

    monkeypatch.setattr(session, "_spec", no_build)
    seen: list[str] = []
    session.run(session.Ctx(cluster="dgx-h100", workdir=tmp_path, gpus=1), dry=False,
                out=seen.append)
    text = "\n".join(seen)
    for name in ("bridge-32k-mask", "fit-pp1"):
        assert f"first-session {name}: FAIL  not run: Megatron-Bridge not importable" in text
    skipped = [ln.split()[2].rstrip(":") for ln in seen if "SKIPPED" in ln]
    assert skipped == ["guard-cp4", "negatives", "fit-pp2", "srun-one-gpu-per-task"]
