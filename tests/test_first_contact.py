"""First contact on a login node where SLURM's client is installed but its controller does
not answer (issue 31, item 1): fake ``sbatch``/``sinfo``/``srun`` that fail as a down
controller does, first on PATH in a temp folder for these tests only (the shared local
cluster is never touched).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOWN = "slurm_load_partitions: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def down_slurm(tmp_path) -> dict:
    """An environment whose PATH starts with SLURM commands that fail like a down controller."""
    bin_dir = tmp_path / "fake-slurm-bin"
    bin_dir.mkdir()
    for name in ("sinfo", "sbatch", "srun", "squeue", "scancel", "sacct"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\necho '{name}: error: {DOWN}' >&2\nexit 1\n")
        tool.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "COLUMNS": "100",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def hcp(cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


def test_readme_first_command_predicts_when_slurm_does_not_answer(tmp_path, down_slurm):
    r = hcp(tmp_path, down_slurm, "sweep", "cp=8", "seq=131072")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    why = [ln for ln in r.stderr.splitlines() if "does not answer" in ln]
    assert len(why) == 1 and "sinfo" in why[0] and "Unable to contact" in why[0], r.stderr
    assert "predicted" in r.stdout.lower()
    assert not (tmp_path / "results").exists()  # a prediction writes nothing


@pytest.mark.parametrize("extra", [["executor=slurm"], ["executor=auto", "runner=attention"]])
def test_asked_for_slurm_stops_with_one_line_and_submits_nothing(tmp_path, down_slurm, extra):
    r = hcp(tmp_path, down_slurm, "sweep", "cp=4", "seq=[2048,4096]", "model=tiny",
            "cluster=local", "runner=attention", *extra)
    assert r.returncode == 5, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("hcp-tune: error:"), r.stderr
    assert "`sinfo -h` failed (exit 1)" in lines[0] and "Unable to contact" in lines[0]
    jobs = tmp_path / "results" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())
