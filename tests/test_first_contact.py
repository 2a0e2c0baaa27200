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


@pytest.mark.parametrize("command", sorted(__import__("hcp_tune.cli").cli.COMMANDS))
def test_help_on_every_command_prints_its_usage(command, capsys):
    from hcp_tune import cli

    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m hcp_tune {command} ")
    assert f"  {command} " in out and "overrides use Hydra syntax" in out


def test_a_broken_profile_is_named_with_its_path_and_line(tmp_path, monkeypatch, capsys):
    from hcp_tune import cli

    (tmp_path / "cluster").mkdir()
    broken = tmp_path / "cluster" / "broken.yaml"
    broken.write_text("name: broken\ngpus_per_node: 8\ndevice: cuda: x\n")
    (tmp_path / "cluster" / "typo.yaml").write_text("name: typo\ngpus_per_node: eight\n")
    monkeypatch.setenv("HCP_TUNE_CONFIG_PATH", str(tmp_path))
    assert cli.main(["plan", "cp=8", "seq=131072", "cluster=broken"]) == 2
    err = capsys.readouterr().err
    assert f"{broken}:3:" in err and "not valid YAML" in err and "malformed override" not in err
    assert cli.main(["plan", "cp=8", "cluster=typo"]) == 2
    assert f"gpus_per_node='eight': expected an integer >= 1 (in {tmp_path}/cluster/typo.yaml:2)" \
        in capsys.readouterr().err


@pytest.mark.parametrize("args", [["results"], ["report"], ["regress", "baseline=a", "candidate=b"],
                                  ["recommend", "cluster=local"],
                                  ["recommend", "cluster=local", "model=tiny", "cp=4", "seq=2048"]])
def test_one_wording_for_a_missing_folder(tmp_path, capsys, args):
    from hcp_tune import cli

    missing = tmp_path / "nope"
    cli.main([*args, f"results_dir={missing}"])
    out = capsys.readouterr()
    assert f"results_dir={missing}: no such folder" in " ".join((out.out + out.err).split())
