"""The local launcher's own contract (orchestrator side): no torch, argument checks."""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_spec
from hcp_tune.launch import run_local_batch
from hcp_tune.layout import Layout

ROOT = Path(__file__).resolve().parent.parent


def test_launcher_imports_no_torch():
    code = "import sys, hcp_tune.launch; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_batch_of_mixed_world_sizes_is_rejected_with_the_sizes(tmp_path):
    specs = [make_spec(Layout(1, 2)), make_spec(Layout(2, 2))]
    with pytest.raises(ValueError, match=r"specs need one world size, got \[2, 4\]"):
        run_local_batch(specs, workdir=tmp_path)


def test_empty_batch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no specs given"):
        run_local_batch([], workdir=tmp_path)
