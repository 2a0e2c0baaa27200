"""The package works where it is installed, not only from a source checkout.

Builds the wheel from a copy of the sources, installs it (not editable) into a fresh
virtual environment without system site-packages, and runs the orchestrator from an
unrelated folder with PYTHONPATH cleared, so nothing can be found through the checkout.
Marked ``wheel`` (``-m wheel``): .ci/run times it on its own.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "hcp_tune", "conf", "sweeps")
SPLITS = ("[1,8]", "[2,4]", "[4,2]", "[8,1]")


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _has_modern_setuptools() -> bool:
    """setuptools >= 70.1 builds wheels without the ``wheel`` package: no download needed."""
    try:
        major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """hcp_tune-*.whl built from a copy of the sources (the checkout gets no build/)."""
    src = tmp_path_factory.mktemp("src")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=skip)
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("dist")
    isolation = ["--no-build-isolation"] if _has_modern_setuptools() else []  # else pip fetches it
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", out, src])
    (whl,) = out.glob("hcp_tune-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """(python of a fresh venv holding the installed wheel and its dependencies, env)."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(root)
    py = root / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", wheel])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "HCP_TUNE_CONF_DIR", "HCP_TUNE_CONFIG_PATH", "VIRTUAL_ENV")}
    return py, env


def test_wheel_holds_every_module_config_and_preset(wheel):
    """pyproject lists the packages by name (the conf/sweeps mapping needs it): a new
    subpackage that is not listed fails here instead of in a user's install."""
    names = set(zipfile.ZipFile(wheel).namelist())
    want = [f.relative_to(REPO).as_posix() for f in (REPO / "hcp_tune").rglob("*.py")]
    want += [f"hcp_tune/{f.relative_to(REPO).as_posix()}"
             for top in ("conf", "sweeps") for f in (REPO / top).rglob("*.yaml")]
    missing = [w for w in want if w not in names]
    assert not missing, f"not in {wheel.name}: {missing}"


def test_installed_wheel_imports_from_site_packages_without_torch(installed, tmp_path):
    py, env = installed
    r = _run([py, "-c", "import hcp_tune, importlib.util as u; "
              "print(hcp_tune.__file__); print(u.find_spec('torch') is None)"],
             cwd=tmp_path, env=env)
    where, no_torch = r.stdout.split()
    assert Path(where).is_relative_to(py.parent.parent) and "site-packages" in where
    assert no_torch == "True"  # plan and sweep runner=model below never need it


def test_plan_runs_from_an_unrelated_folder(installed, tmp_path):
    py, env = installed
    r = _run([py, "-m", "hcp_tune", "plan", "cp=8", "seq=131072"], cwd=tmp_path, env=env)
    assert "model=llama3-8b cluster=dgx-h100 cp=8" in r.stdout
    assert all(s in r.stdout for s in SPLITS), r.stdout
    r = _run([py.parent / "hcp-tune", "plan", "cp=8", "seq=131072", "format=json"],
             cwd=tmp_path, env=env)
    got = {tuple(c["sizes"]): c["kept"] for c in json.loads(r.stdout)["candidates"]}
    assert got == {(1, 8): True, (2, 4): True, (4, 2): True, (8, 1): True}


def test_model_sweep_runs_from_an_unrelated_folder(installed, tmp_path):
    py, env = installed
    r = _run([py, "-m", "hcp_tune", "sweep", "runner=model", "cp=8", "seq=131072"],
             cwd=tmp_path, env=env)
    assert "PREDICTED" in r.stdout and all(s in r.stdout for s in SPLITS), r.stdout


def test_presets_user_profiles_and_option_lists_come_from_the_package(installed, tmp_path):
    py, env = installed
    r = _run([py, "-m", "hcp_tune", "plan", "sweeps=cpu-smoke"], cwd=tmp_path, env=env)
    assert "model=tiny cluster=local cp=4" in r.stdout
    r = subprocess.run([py, "-m", "hcp_tune", "plan", "cluster=nope"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2
    assert "expected one of: dgx-a100, dgx-h100, dgx-h200, gb200-nvl72, local" in r.stderr
    mine = tmp_path / "profiles"
    (mine / "cluster").mkdir(parents=True)
    (mine / "cluster" / "mine.yaml").write_text(
        "device: cuda\ngpu_name: L40S\ngpus_per_node: 4\nintra_node_bw_gbs: 32\n"
        "inter_node_bw_gbs: 25\npeak_bf16_tflops: 362\ngpu_memory_gib: 48\n")
    r = _run([py, "-m", "hcp_tune", "plan", "cluster=mine", "cp=8", "seq=65536"],
             cwd=tmp_path, env={**env, "HCP_TUNE_CONFIG_PATH": str(mine)})
    assert "cluster=mine" in r.stdout
