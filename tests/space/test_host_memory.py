"""Host memory of a runner=bridge trial in ``plan`` (issue 30): per rank and per node,
without the S x S mask the runner turns off, against ``cluster.host_memory_gib``."""
from __future__ import annotations

import pytest

from hcp_tune import config
from hcp_tune.engine import sweep_plan
from hcp_tune.space import host_memory


def _plan(*extra: str) -> dict:
    cfg = config.load(["cp=8", "seq=131072", "runner=bridge", "model=llama3-8b",
                       "cluster=dgx-h100", *extra])
    return sweep_plan.plan_rows(cfg)


def test_plan_shows_a_per_rank_estimate_without_the_seq_by_seq_mask():
    plan = _plan()
    hm = plan["host_memory"]
    assert hm["seq"] == 131072 and hm["ranks_per_node"] == 8 and hm["node_gib"] == 2048
    # 6 GiB process + 4 GiB workers + 17 samples * 131072 tokens * 28 B
    assert hm["per_rank_gib"] == pytest.approx(6 + 4 + 17 * 131072 * 28 / 2 ** 30)
    assert hm["per_rank_gib"] < 11 and not hm["over"]
    # the mask it leaves out: 16 GiB a sample in flight and 128 GiB of float temporaries
    assert hm["with_mask_per_rank_gib"] - hm["per_rank_gib"] == pytest.approx(17 * 16 + 128)
    (line,) = [n for n in plan["notes"] if n.startswith("host memory per rank")]
    assert "no S x S mask: create_attention_mask=False" in line
    assert "8 rank(s) a node: 80 GiB of the node's 2048 GiB" in line


def test_a_node_whose_ranks_pass_its_memory_is_warned_about():
    hm = _plan("cluster.host_memory_gib=64")["host_memory"]
    assert hm["over"] and "WARNING: over 90% of the node's 64 GiB" in hm["text"]
    assert "dataset.num_workers=2" in hm["text"]


def test_a_profile_without_host_memory_is_not_checked_and_the_attention_runner_has_none():
    assert "not checked" in _plan("cluster=pcie-a100")["host_memory"]["text"]
    assert _plan("runner=attention")["host_memory"] is None


def test_the_estimate_counts_the_workers_the_job_runs():
    from hcp_tune.job.bridge.parity import RECIPE_NUM_WORKERS

    assert host_memory.NUM_WORKERS == RECIPE_NUM_WORKERS
