"""The package works where it is installed, not only from a source checkout, and installs
into a Bridge container without touching its stack.

Builds the wheel from a copy of the sources, installs it (not editable) into a fresh
virtual environment without system site-packages, and runs the orchestrator from an
unrelated folder with PYTHONPATH cleared, so nothing can be found through the checkout.
For the container, this lane's environment (torch, numpy and Megatron-Core installed:
0.16 on Python 3.11, 0.19 on 3.12) stands in for it: ``pip install --dry-run --report``
says what the documented commands would install, and every requirement of what the
``--no-deps`` container command installs must already be met there.
Marked ``wheel`` (``-m wheel``): .ci/run times it on its own.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
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
    want += ["hcp_tune/costmodel/data/bands.json",  # the shipped band predict reads
             "hcp_tune/costmodel/data/calibrations/a100-nvlink-published.json",
             "hcp_tune/outputs/regress/known_causes.yaml"]  # regress's known upstream causes
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
    # tp=1 pp=1: every split of cp=8 is kept (the Bridge recipe's tp=4 keeps two of them)
    r = _run([py, "-m", "hcp_tune", "plan", "cp=8", "seq=131072", "tp=1", "pp=1"], cwd=tmp_path,
             env=env)
    assert "model=llama3-8b cluster=dgx-h100 cp=8" in r.stdout
    assert all(s in r.stdout for s in SPLITS), r.stdout
    r = _run([py.parent / "hcp-tune", "plan", "cp=8", "seq=131072", "tp=1", "pp=1", "format=json"],
             cwd=tmp_path, env=env)
    got = {tuple(c["sizes"]): c["kept"] for c in json.loads(r.stdout)["candidates"]}
    assert got == {(1, 8): True, (2, 4): True, (4, 2): True, (8, 1): True}


def test_model_sweep_runs_from_an_unrelated_folder(installed, tmp_path):
    py, env = installed
    r = _run([py, "-m", "hcp_tune", "sweep", "runner=model", "cp=8", "seq=131072", "tp=1", "pp=1"],
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


STACK = ("torch", "numpy", "megatron-core")  # the container's: never to be changed
JOB_ADDS = ("submitit", "cloudpickle")       # what the job side needs besides the stack


def _report(tmp_path, *args) -> list[dict]:
    """The items ``pip install --dry-run --report`` says ``pip install ARGS`` would install."""
    report = tmp_path / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", report, *args])
    return json.loads(report.read_text())["install"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def _would_install(tmp_path, *args) -> dict[str, str]:
    """{normalised name: version} that ``pip install ARGS`` would install here."""
    return {_norm(i["metadata"]["name"]): i["metadata"]["version"]
            for i in _report(tmp_path, *args)}


def test_container_install_leaves_no_requirement_of_the_job_side_unmet(wheel, tmp_path):
    """The container command installs with ``--no-deps``, so it adds exactly what it names
    (that needs no test). What can break is the other side: a requirement of submitit or
    cloudpickle that the container does not already hold. This lane's environment is the
    container's stand-in (the 3.12 lane is pinned to a Bridge 0.6 container's versions:
    ci/constraints-py312.txt); every requirement of what the command installs must be met
    by what is installed here or by the command itself."""
    from packaging.requirements import Requirement

    items = _report(tmp_path, "--no-deps", wheel, *JOB_ADDS)
    adds = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    assert "hcp-tune" in adds and set(adds) <= {"hcp-tune", *JOB_ADDS}, adds
    # what each named package requires: from the report, or (already installed here, so
    # pip installs nothing for it) from its installed metadata
    requires = {_norm(i["metadata"]["name"]): i["metadata"].get("requires_dist", [])
                for i in items}
    for name in JOB_ADDS:
        requires.setdefault(name, importlib.metadata.requires(name) or [])
    unmet = []
    for name in JOB_ADDS:
        for text in requires[name]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                version = adds.get(_norm(req.name)) or importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                version = None
            if version is None or not req.specifier.contains(version, prereleases=True):
                unmet.append(f"{name} needs {req} (have: {version})")
    assert not unmet, unmet


def test_job_extra_keeps_the_installed_torch_numpy_and_megatron_core(wheel, tmp_path):
    """Even ``pip install hcp-tune[job]`` beside the stack keeps it (no upper bound below
    what Bridge ships; before, megatron-core 0.19.2 was replaced by 0.16.1)."""
    have = {n: importlib.metadata.version(n) for n in STACK}
    got = _would_install(tmp_path, f"{wheel}[job]")
    assert not {n: (have[n], got[n]) for n in STACK if n in got}, f"would change: {got}"


def test_megatron_core_bound_admits_every_version_bridge_ships(wheel):
    from packaging.requirements import Requirement

    whl = zipfile.ZipFile(wheel)
    (name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
    meta = whl.read(name).decode()
    reqs = [Requirement(line.split(":", 1)[1]) for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "megatron-core" in line]
    assert reqs, "no megatron-core requirement in the job/test extras"
    # 0.12: the first with create_gloo_process_groups; Bridge 0.4/0.5/0.6 ship 0.17/0.18/0.19
    want = ["0.12.0", "0.16.1", "0.17.0", "0.18.0", "0.19.2", "0.20.0"]
    for r in reqs:
        assert [v for v in want if r.specifier.contains(v)] == want, str(r)
        assert not r.specifier.contains("0.11.0"), str(r)
