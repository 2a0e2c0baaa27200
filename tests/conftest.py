"""Shared fixtures. ``slurm_cluster`` makes sure the local SLURM cluster answers.

The cluster comes from scripts/slurm-local.sh (started here when sinfo does not answer).
If it cannot come up the slurm tests skip, with the reason; with HCP_TUNE_REQUIRE_SLURM=1
(CI) they fail instead, so a broken cluster never passes as skipped tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import payloads  # noqa: E402

cloudpickle.register_pickle_by_value(payloads)  # jobs unpickle without the tests folder

REPO = Path(__file__).resolve().parents[1]


def _node_ready() -> bool:
    if not (shutil.which("sinfo") and shutil.which("sbatch")):
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    if _node_ready():
        return
    script = REPO / "scripts" / "slurm-local.sh"
    run = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-3:])
        reason = f"local SLURM cluster did not come up ({script} start exited {run.returncode}): {tail}"
        if os.environ.get("HCP_TUNE_REQUIRE_SLURM") == "1":
            pytest.fail(reason + " [HCP_TUNE_REQUIRE_SLURM=1]", pytrace=False)
        pytest.skip(reason)
