"""What users and jobs name by module path keeps working after the package moved: the
commands (``python -m ...``, ``hcp_tune.calibrate`` among them), and job payloads pickled
by an hcp-tune from before the move (tests/data/payloads-8f3d4ce: pickled by commit 8f3d4ce,
the last commit with the flat layout), so a sweep that was running across an upgrade
still resumes its jobs."""
from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from helpers import REPO

PICKLED = REPO / "tests" / "data" / "payloads-8f3d4ce"


@pytest.mark.parametrize("module, code, says", [
    ("hcp_tune", 2, "usage: python -m hcp_tune COMMAND"),
    ("hcp_tune.calibrate", 2, "usage: python -m hcp_tune.calibrate ROWS.json"),
    ("hcp_tune.gpucheck", 0, "usage: gpu_check.sh"),
    ("hcp_tune.job.entry", 2, "usage: python -m hcp_tune.job.entry SPEC.json OUT.json"),
    ("hcp_tune.job.steps", 2, "usage"),
])
def test_module_commands_still_run(module, code, says):
    args = ["--help"] if module == "hcp_tune.gpucheck" else []
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr


def test_the_calibrate_command_module_is_the_moved_module():
    import hcp_tune.calibrate
    from hcp_tune.costmodel.calibrate import main as calibrate_main

    assert hcp_tune.calibrate.main is calibrate_main


def test_a_payload_pickled_before_the_move_unpickles_to_todays_objects():
    from hcp_tune.job.payload import batch_payload, steps_payload
    from hcp_tune.job.steps import StepLaunch
    from hcp_tune.spec import Status, TrialResult, TrialSpec

    batch = pickle.loads((PICKLED / "batch.pkl").read_bytes())
    assert batch.function is batch_payload
    (spec,) = batch.args[0]
    assert isinstance(spec, TrialSpec) and (spec.trial_id, spec.a2a, spec.p2p) == ("t-pickle-a1", 1, 2)
    steps = pickle.loads((PICKLED / "steps.pkl").read_bytes())
    assert steps.function is steps_payload
    specs, launch, workdir = steps.args
    assert isinstance(launch, StepLaunch) and launch.tasks_per_node == 2 and workdir == "/tmp/w"
    (res,) = pickle.loads((PICKLED / "result.pkl").read_bytes())
    assert isinstance(res, TrialResult) and res.status is Status.OK
