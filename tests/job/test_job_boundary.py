"""The job side imports none of hydra, optuna, pandas, rich (DESIGN section 2)."""
import subprocess
import sys
from pathlib import Path

from helpers import BLOCK, payload_spec, run_pickled_payload

ROOT = Path(__file__).resolve().parents[2]
JOB_DIR = ROOT / "hcp_tune" / "job"
# every module of the job side, its subpackages included ("bridge.runner", "attention.te", ...)
JOB_MODULES = sorted(".".join(p.relative_to(JOB_DIR).with_suffix("").parts)
                     for p in JOB_DIR.rglob("*.py") if p.name != "__init__.py")

BLOCKER = BLOCK + """
import importlib
for m in MODULES:
    importlib.import_module("hcp_tune.job." + m)
import hcp_tune.spec, hcp_tune.job.backend as e
# the lazily imported parts too: Megatron-Core's parallel_state, the backend choice
from megatron.core import parallel_state
e.choose_backend(hcp_tune.spec.TrialSpec(trial_id="x", a2a=1, p2p=2, seq=8, heads=8,
                                         kv_heads=8, head_dim=8), None)
from hcp_tune.job.attention import te as te_attention
assert te_attention.te_min_version_ok("2.17.1+4329ff8")  # packaging, Megatron-Core's dependency
loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
assert not loaded, loaded
print("job side clean")
"""


def test_job_modules_import_with_orchestrator_libraries_blocked():
    code = f"MODULES = {JOB_MODULES!r}\n" + BLOCKER
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "job side clean" in proc.stdout


def test_blocker_really_blocks():
    code = BLOCK + "\nimport pandas\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: import of pandas halted; None in sys.modules" in proc.stderr


def test_job_package_lists_only_allowed_imports():
    allowed = {"__future__", "ast", "atexit", "dataclasses", "datetime", "functools", "importlib",
               "inspect", "json",
               "math", "os", "random", "statistics",
               "platform", "re", "resource", "signal", "socket", "subprocess", "sys", "threading", "time",
               "typing",
               "pathlib", "logging", "packaging", "torch", "megatron", "transformer_engine", "submitit", "hcp_tune",
               # Megatron-Bridge's own dependency: job/bridge/offline.py builds a recipe's
               # Hugging Face config from it (lazily, in recipe mode, in the Bridge container)
               "transformers"}
    import ast
    for path in sorted(JOB_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] in allowed, f"{path.name} imports {n}"
                assert n != "hcp_tune", f"{path.name}: import hcp_tune modules by full name"
                if n.startswith("hcp_tune."):
                    assert n in ("hcp_tune.spec", "hcp_tune.flops", "hcp_tune.noise",
                                 "hcp_tune.merge", "hcp_tune.packing") \
                        or n.startswith("hcp_tune.job"), \
                        f"{path.name} imports orchestrator module {n}"


# ---------------------------------------------------------------- what a job unpickles
# submitit pickles the payload by reference: the job process imports the payload's module
# before anything runs. The payloads are taken from hcp_tune.engine.sweep, i.e. exactly what a
# sweep hands submitit. A ``sitecustomize`` on PYTHONPATH blocks the orchestrator's
# libraries in the job process and in every rank process it starts.


def test_sitecustomize_blocker_reaches_a_fresh_interpreter(tmp_path):
    import os

    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", "import optuna"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "import of optuna halted" in proc.stderr


def test_job_payload_unpickles_and_runs_without_orchestrator_libraries(tmp_path):
    """The one payload of both executors; every rank of a job is a task that runs it."""
    from hcp_tune.engine.sweep import batch_payload  # what the sweep pickles

    assert batch_payload.__module__.startswith("hcp_tune.job.")
    proc = run_pickled_payload(tmp_path, batch_payload, [payload_spec(1, 1, "one-rank")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "payload ran: ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_packed_payload_imports_only_the_contract(tmp_path):
    """A packed trial (THD) brings hcp_tune.packing onto the job side, nothing else of ours."""
    import dataclasses

    from hcp_tune.engine.sweep import batch_payload

    spec = dataclasses.replace(payload_spec(1, 1, "one-rank-packed"), packing="thd",
                               packed_docs=[[20, 3, 7]])
    proc = run_pickled_payload(tmp_path, batch_payload, [spec])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "payload ran: ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]
