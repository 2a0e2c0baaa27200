"""The blocking local path (`launch.run_local_batch`, orchestrator side): no torch, argument
checks, and the job it submits is the sweep's."""
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_spec

from hcp_tune.engine.launch import run_local_batch
from hcp_tune.space.layout import Layout

ROOT = Path(__file__).resolve().parents[2]


def test_launcher_imports_no_torch():
    code = "import sys, hcp_tune.engine.launch; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_batch_of_mixed_world_sizes_is_rejected_with_the_sizes(tmp_path):
    specs = [make_spec(Layout(1, 2)), make_spec(Layout(2, 2))]
    with pytest.raises(ValueError, match=r"specs need one world size, got \[2, 4\]"):
        run_local_batch(specs, workdir=tmp_path)


def test_empty_batch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no specs given"):
        run_local_batch([], workdir=tmp_path)


def test_local_executor_runs_one_task_per_rank_on_the_allowed_gpus(tmp_path, monkeypatch):
    """The sweep's local job has the SLURM job's shape: every rank its own submitit task."""
    import dataclasses

    from hcp_tune.engine import dispatch
    from hcp_tune.engine.launch import default_executor

    cfg = dataclasses.replace(default_executor(), folder=str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    ex = dispatch.make_executor(cfg, world_size=4, gpus_per_node=4)
    assert (ex.parameters["tasks_per_node"], ex.parameters["visible_gpus"]) == (4, [4, 5, 6, 7])
    ex = dispatch.make_executor(cfg, world_size=2, gpus_per_node=0)  # a CPU profile
    assert (ex.parameters["tasks_per_node"], ex.parameters["gpus_per_node"]) == (2, 0)


def test_sweep_hands_both_executors_the_same_payload():
    from hcp_tune.engine.sweep import Sweeper
    from hcp_tune.job.payload import batch_payload

    specs = [make_spec(Layout(1, 2))]
    for name in ("local", "slurm"):
        sweeper = Sweeper.__new__(Sweeper)
        sweeper.executor_name, sweeper.steps = name, False  # executor.batch=processes
        sweeper.keep = False  # keep_allocation=false; the pool: tests/engine/test_sweep_pool.py
        assert sweeper._args(specs) == (batch_payload, specs)
