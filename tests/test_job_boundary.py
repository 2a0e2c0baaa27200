"""The job side imports none of hydra, optuna, pandas, rich (DESIGN section 2)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB_MODULES = ["dist", "groups", "ref_attention", "te_attention", "verify", "bench", "entry"]

# The libraries are made to look uninstalled: ``sys.modules[name] = None`` makes ``import name``
# raise ImportError and ``importlib.util.find_spec(name)`` return None. (A meta-path finder that
# raises would also break torch._dynamo, which probes optional modules with find_spec at
# import time: a false failure that says nothing about our imports.)
BLOCK = """
import sys
BLOCKED = {"hydra", "omegaconf", "optuna", "pandas", "rich"}
for name in BLOCKED:
    sys.modules[name] = None
"""
BLOCKER = BLOCK + """
import importlib
for m in MODULES:
    importlib.import_module("hcp_tune.job." + m)
import hcp_tune.spec, hcp_tune.job.entry as e
# the lazily imported parts too: Megatron-Core's parallel_state, the backend choice
from megatron.core import parallel_state
e.choose_backend(hcp_tune.spec.TrialSpec(trial_id="x", a2a=1, p2p=2, seq=8, heads=8,
                                         kv_heads=8, head_dim=8))
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
    allowed = {"__future__", "dataclasses", "datetime", "importlib", "json", "math", "os",
               "platform", "re", "resource", "socket", "subprocess", "sys", "threading", "time",
               "typing",
               "pathlib", "torch", "megatron", "transformer_engine", "submitit", "hcp_tune"}
    import ast
    for path in sorted((ROOT / "hcp_tune" / "job").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] in allowed, f"{path.name} imports {n}"
                if n.startswith("hcp_tune."):
                    assert n in ("hcp_tune.spec", "hcp_tune.flops") or n.startswith("hcp_tune.job"), \
                        f"{path.name} imports orchestrator module {n}"
