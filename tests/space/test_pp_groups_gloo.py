"""The planned groups with pipeline stages against Megatron-Core's real
``initialize_model_parallel`` on gloo: tp=1, cp=4 as [2,2], pp=2 (8 processes).

Each stage must get CP groups of its own (ranks 0-3 and 4-7), and the HCP levels inside
them must be the planned ones; the pipeline groups pair rank r with r + tp*cp*dp.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune.job.dist import quiet_ports
from hcp_tune.space.layout import Layout, rank_groups

WORKER = Path(__file__).with_name("pp_groups_worker.py")
WORLD = 8


def _canon(groups) -> list[tuple[int, ...]]:
    return sorted({tuple(g) for g in groups})


@pytest.mark.multiproc
def test_pipeline_stages_get_the_planned_cp_groups_on_gloo(tmp_path):
    out = tmp_path / "groups.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(quiet_ports()),
           "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(out)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    seen = json.loads(out.read_text())
    planned = rank_groups(Layout(2, 2), tp=1, dp=1, pp=2, gpus_per_node=8)
    for kind in ("cp", "a2a", "p2p"):
        assert _canon(r[kind] for r in seen) == _canon(getattr(planned, kind)), kind
    assert _canon(r["cp"] for r in seen) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert _canon(r["pp"] for r in seen) == [(0, 4), (1, 5), (2, 6), (3, 7)]
