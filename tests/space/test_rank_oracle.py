"""The planned rank groups (``hcp_tune.space.layout.rank_groups``) against Megatron-Core's own
construction, with whichever Megatron-Core this lane installed (0.16 on Python 3.11, 0.19
on 3.12).

The oracle is Megatron-Core's code, not a copy of it: ``RankGenerator(...).get_ranks("cp")``
with ``initialize_model_parallel``'s default order gives the flat CP groups, and
``create_hierarchical_groups`` (what ``initialize_model_parallel`` calls for
``hierarchical_context_parallel_sizes=[a2a, p2p]``) splits each of them, with
``create_group`` replaced by a recorder so that no process group is needed.
"""
from __future__ import annotations

import inspect

import pytest
from megatron.core import parallel_state as ps

from hcp_tune.space.layout import factorizations, rank_groups

ORDER = inspect.signature(ps.initialize_model_parallel).parameters["order"].default
COMBOS = [(tp, cp, dp) for tp in (1, 2, 4, 8) for cp in (1, 2, 3, 4, 6, 8, 12, 16)
          for dp in (1, 2, 3) if tp * cp * dp <= 256]
# pipeline stages on top: each stage must get CP groups of its own, in Megatron-Core's order
PP_COMBOS = [(tp, cp, dp, pp) for tp in (1, 2, 4) for cp in (2, 4, 8) for dp in (1, 2)
             for pp in (2, 3, 4) if tp * cp * dp * pp <= 256]


def megatron_groups(tp: int, cp: int, dp: int, sizes: list[int], monkeypatch, pp: int = 1):
    """(cp groups, level-0 groups, level-1 groups) as Megatron-Core builds them."""
    gen = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=ORDER)
    made: list[tuple[str, tuple[int, ...]]] = []

    def record(ranks=None, group_desc=None, **_):
        made.append((group_desc, tuple(ranks)))
        return object()

    monkeypatch.setattr(ps, "create_group", record)
    cp_groups = [tuple(r) for r in gen.get_ranks("cp")]
    for ranks in gen.get_ranks("cp"):
        ps.create_hierarchical_groups(ranks[0], ranks, sizes, group_desc="CONTEXT_PARALLEL_GROUP")
    level = {lv: [r for desc, r in made if desc.endswith(f"_L{lv}")] for lv in (0, 1)}
    assert len(made) == len(level[0]) + len(level[1])  # two levels, nothing else
    return cp_groups, level[0], level[1]


def test_order_is_megatron_cores_default():
    assert ORDER == "tp-cp-ep-dp-pp"  # what rank_groups assumes (its docstring)


@pytest.mark.parametrize("tp,cp,dp", COMBOS, ids=[f"tp{t}-cp{c}-dp{d}" for t, c, d in COMBOS])
def test_planned_groups_equal_megatron_cores(tp, cp, dp, monkeypatch):
    for layout in factorizations(cp):
        want_cp, want_a2a, want_p2p = megatron_groups(tp, cp, dp, layout.sizes, monkeypatch)
        got = rank_groups(layout, tp=tp, dp=dp, gpus_per_node=8)
        # Same groups, same member order inside each group (the rank order TE sees);
        # the order of the groups in the list carries no meaning.
        assert sorted(got.cp) == sorted(want_cp), layout
        assert sorted(got.a2a) == sorted(want_a2a), layout
        assert sorted(got.p2p) == sorted(want_p2p), layout
        assert got.world_size == tp * cp * dp


@pytest.mark.parametrize("tp,cp,dp,pp", PP_COMBOS,
                         ids=[f"tp{t}-cp{c}-dp{d}-pp{p}" for t, c, d, p in PP_COMBOS])
def test_planned_groups_with_pipeline_stages_equal_megatron_cores(tp, cp, dp, pp, monkeypatch):
    for layout in factorizations(cp):
        want_cp, want_a2a, want_p2p = megatron_groups(tp, cp, dp, layout.sizes, monkeypatch, pp)
        got = rank_groups(layout, tp=tp, dp=dp, pp=pp, gpus_per_node=8)
        assert sorted(got.cp) == sorted(want_cp), layout
        assert sorted(got.a2a) == sorted(want_a2a), layout
        assert sorted(got.p2p) == sorted(want_p2p), layout
        assert got.world_size == tp * cp * dp * pp
        stage = tp * cp * dp  # every CP group lies inside one stage's consecutive ranks
        assert all(len({r // stage for r in g}) == 1 for g in got.cp)
