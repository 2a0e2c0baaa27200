"""runner=bridge: the CP-active proof on recorded evidence, and the production guard.

Evidence is what ``bridge_verify.collect`` reads from a model at train start; the planted
failures are the ones that happen: attention modules without the CP group (Bridge #2667),
groups that differ from the plan, TFLOP/s over the peak.
"""
from types import SimpleNamespace

import pytest
import torch

from hcp_tune.job.bench import over_peak
from hcp_tune.job.bridge.guard import HCPGuard, HCPNotActiveError, configured_layout
from hcp_tune.job.bridge.verify import (
    AttentionEvidence,
    RankEvidence,
    check_cp_active,
    collect,
    summarize_problems,
)
from hcp_tune.space.layout import Layout, rank_groups

PLAN = rank_groups(Layout(a2a=2, p2p=2), tp=1, gpus_per_node=8).as_dict()
# cp [[0,1,2,3]], a2a [[0,1],[2,3]], p2p [[0,2],[1,3]]


def good_rank(r, comm="a2a+p2p", layers=2):
    a2a = [0, 1] if r < 2 else [2, 3]
    p2p = [0, 2] if r % 2 == 0 else [1, 3]
    groups = [a2a, p2p] if comm == "a2a+p2p" else [[0, 1, 2, 3]]
    mods = [AttentionEvidence(name=f"decoder.layers.{i}.self_attention.core_attention",
                              cp_comm_type=comm, cp_groups=groups, cp_global_ranks=[0, 1, 2, 3])
            for i in range(layers)]
    return RankEvidence(rank=r, modules=mods, hcp_state=[a2a, p2p] if comm == "a2a+p2p" else None,
                        cp_state=[0, 1, 2, 3])


def check(evidence, comm="a2a+p2p", a2a=2, p2p=2, plan=PLAN):
    return check_cp_active(evidence, a2a=a2a, p2p=p2p, comm_type=comm, expected=plan,
                           world_size=4)


def test_active_hierarchical_cp_passes():
    assert check([good_rank(r) for r in range(4)]) == []


@pytest.mark.parametrize("comm,a2a,p2p", [("p2p", 1, 4), ("a2a", 4, 1)])
def test_active_baselines_pass(comm, a2a, p2p):
    plan = rank_groups(Layout(a2a=a2a, p2p=p2p), tp=1, gpus_per_node=8).as_dict()
    assert check([good_rank(r, comm) for r in range(4)], comm, a2a, p2p, plan) == []


def test_planted_cp_off_modules_without_the_cp_group():
    # Bridge #2667: a2a+p2p without sizes -> TEDotProductAttention got cp_group=None
    evidence = [RankEvidence(rank=r, cp_state=[0, 1, 2, 3], hcp_state=None, modules=[
        AttentionEvidence(name="decoder.layers.0.self_attention.core_attention",
                          cp_comm_type="a2a+p2p", cp_groups=None, cp_global_ranks=[0, 1, 2, 3])])
        for r in range(4)]
    problems = check(evidence)
    assert any("has no hierarchical CP groups" in p for p in problems)
    assert any("holds no CP group (cp_group=None)" in p and "#2667" in p for p in problems)
    assert len(problems) == 8  # both findings on each of the 4 ranks


def test_one_module_without_the_group_is_enough():
    evidence = [good_rank(r) for r in range(4)]
    evidence[3].modules[1].cp_groups = None
    problems = check(evidence)
    assert problems == [
        "rank 3: decoder.layers.1.self_attention.core_attention holds no CP group "
        "(cp_group=None): TE runs it on this rank's chunk only, the silent CP-off failure "
        "of Megatron-Bridge issue #2667"]


def test_groups_that_differ_from_the_plan():
    evidence = [good_rank(r) for r in range(4)]
    for ev in evidence:  # levels swapped: a2a over the stride, p2p contiguous
        swapped = [[0, 2] if ev.rank % 2 == 0 else [1, 3], [0, 1] if ev.rank < 2 else [2, 3]]
        ev.hcp_state = swapped
        for m in ev.modules:
            m.cp_groups = swapped
    problems = check(evidence)
    assert "rank 0: parallel_state's hierarchical groups [[0, 2], [0, 1]] differ from the plan's " \
           "[[0, 1], [0, 2]]" in problems
    assert any("core_attention's CP groups [[0, 2], [0, 1]] differ from the plan's" in p
               for p in problems)


def test_wrong_comm_type_and_flat_group_for_hierarchical():
    evidence = [good_rank(r) for r in range(4)]
    evidence[0].modules[0].cp_comm_type = "p2p"
    evidence[1].modules[0].cp_groups = [[0, 1, 2, 3]]
    problems = check(evidence)
    assert problems[0].startswith("rank 0: decoder.layers.0.self_attention.core_attention has "
                                  "cp_comm_type='p2p', expected 'a2a+p2p'")
    assert "holds 1 CP group(s), expected two levels" in problems[1]


def test_no_attention_modules_cannot_prove_anything():
    evidence = [good_rank(r) for r in range(4)]
    evidence[2].modules = []
    assert check(evidence) == ["rank 2: no Transformer Engine attention module in the model "
                               "(transformer_impl must be 'transformer_engine'): CP cannot be "
                               "proven"]


def test_missing_ranks_are_reported():
    assert check([good_rank(0)]) == ["evidence from 1 of 4 ranks"]


def test_over_peak_and_summary():
    assert over_peak(1937.0, 989.0).startswith("achieved 1937.0 TFLOP/s per GPU exceeds the "
                                               "hardware peak 989.0")
    assert over_peak(500.0, 989.0) is None and over_peak(500.0, None) is None
    assert summarize_problems(["a", "b", "c"]) == "a (+2 more)"


# ---------------------------------------------------------------- collect() on a model

class FakeAttention(torch.nn.Module):
    """Stands in for TE's DotProductAttention: the attributes TE keeps."""

    def __init__(self, comm, group, global_ranks):
        super().__init__()
        self.cp_comm_type, self.cp_group, self.cp_global_ranks = comm, group, global_ranks


def test_collect_reads_modules_and_state():
    ranks = {"L0": [0, 1], "L1": [0, 2], "CP": [0, 1, 2, 3]}
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), FakeAttention("a2a+p2p", ["L0", "L1"], [0, 1, 2, 3]),
                                FakeAttention("a2a+p2p", None, [0, 1, 2, 3]))
    ev = collect([model], 0, is_attention=lambda m: isinstance(m, FakeAttention),
                 ranks_of=lambda g: ranks[g], hcp_state=["L0", "L1"], cp_state="CP")
    assert [m.name for m in ev.modules] == ["chunk0.1", "chunk0.2"]
    assert ev.modules[0].cp_groups == [[0, 1], [0, 2]] and ev.modules[1].cp_groups is None
    assert ev.hcp_state == [[0, 1], [0, 2]] and ev.cp_state == [0, 1, 2, 3]
    assert RankEvidence.from_dict(ev.as_dict()) == ev


# ---------------------------------------------------------------- the guard

def model_cfg(cp=4, comm="a2a+p2p", sizes=(2, 2)):
    return SimpleNamespace(context_parallel_size=cp, cp_comm_type=comm,
                           hierarchical_context_parallel_sizes=list(sizes) if sizes else None)


def guard_context(cfg):
    return SimpleNamespace(state=SimpleNamespace(cfg=SimpleNamespace(model=cfg)), model=["m"])


def make_guard(evidence, me=0):
    lines = []
    g = HCPGuard(log=lines.append, collect_fn=lambda model, r: evidence[r],
                 gather=lambda mine: [e.as_dict() for e in evidence], rank=lambda: me)
    return g, lines


def test_guard_passes_and_logs_the_groups_found():
    g, lines = make_guard([good_rank(r) for r in range(4)])
    g.on_train_start(guard_context(model_cfg()))
    assert g.report["problems"] == []
    assert lines[-1] == "hcp-guard: cp_comm_type=a2a+p2p [a2a, p2p] = [2, 2]: CP active on every rank"
    assert "rank 0: parallel_state CP group [0, 1, 2, 3], hierarchical groups [[0, 1], [0, 2]]; " \
           "2 module(s) cp_comm_type=a2a+p2p cp_group=[[0, 1], [0, 2]]" in lines[0]


def test_guard_fails_fast_on_planted_cp_off():
    evidence = [good_rank(r) for r in range(4)]
    for ev in evidence:
        ev.hcp_state = None
        for m in ev.modules:
            m.cp_groups = None
    g, lines = make_guard(evidence, me=1)
    with pytest.raises(HCPNotActiveError, match="rank 0: Megatron-Core's parallel_state has no "
                                                "hierarchical CP groups"):
        g.on_train_start(guard_context(model_cfg()))
    assert lines == []  # only rank 0 logs; every rank raises


def test_guard_refuses_a2a_p2p_without_sizes_before_reading_anything():
    g, _ = make_guard([])
    with pytest.raises(HCPNotActiveError, match="hierarchical_context_parallel_sizes is not set"):
        g.on_train_start(guard_context(model_cfg(sizes=None)))


@pytest.mark.parametrize("cfg,layout", [
    (model_cfg(cp=1, comm="a2a+p2p", sizes=None), None),
    (model_cfg(cp=4, comm="p2p", sizes=None), ("p2p", 1, 4)),
    (model_cfg(cp=4, comm=None, sizes=None), ("p2p", 1, 4)),
    (model_cfg(cp=8, comm="a2a", sizes=None), ("a2a", 8, 1)),
    (model_cfg(cp=8, comm=["a2a+p2p"] * 3, sizes=(4, 2)), ("a2a+p2p", 4, 2)),
])
def test_configured_layout(cfg, layout):
    assert configured_layout(cfg) == layout


def test_configured_layout_rejects_bad_sizes():
    with pytest.raises(HCPNotActiveError, match=r"\[2, 2\]: expected two sizes whose product is "
                                                r"context_parallel_size=8"):
        configured_layout(model_cfg(cp=8, sizes=(2, 2)))


def test_guard_skips_runs_without_cp():
    g, lines = make_guard([])
    g.on_train_start(guard_context(model_cfg(cp=1, sizes=None)))
    assert g.report == {"checked": False, "reason": "no context parallelism configured"}
