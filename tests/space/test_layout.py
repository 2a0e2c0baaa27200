"""The layout space: enumeration, the HCP rules with reasons, and Megatron-Core's groups."""
import math

import pytest

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.space.layout import Layout, enumerate_layouts, factorizations, rank_groups

H100 = ClusterProfile(
    name="h", device="cuda", gpu_name="x", gpus_per_node=8, intra_node_bw_gbs=450,
    inter_node_bw_gbs=50, peak_bf16_tflops=989, gpu_memory_gib=80,
)


def model(heads: int, kv: int) -> ModelSpec:
    return ModelSpec(name=f"m{heads}-{kv}", layers=2, hidden=heads * 8, ffn_hidden=64,
                     heads=heads, kv_heads=kv, head_dim=8, vocab=64)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16, 32, 64])
def test_factorizations_are_every_ordered_two_level_split(cp):
    layouts = factorizations(cp)
    assert [l.a2a for l in layouts] == divisors(cp)
    assert all(l.a2a * l.p2p == cp for l in layouts)


@pytest.mark.parametrize("cp", [2, 4, 8, 16, 32, 64])
def test_endpoints_run_as_baselines(cp):
    layouts = factorizations(cp)
    assert layouts[0] == Layout(1, cp) and layouts[0].comm_type == "p2p"
    assert layouts[-1] == Layout(cp, 1) and layouts[-1].comm_type == "a2a"
    assert all(l.comm_type == "a2a+p2p" for l in layouts[1:-1])


def test_cp1_has_one_layout_without_cp():
    (only,) = factorizations(1)
    assert only.comm_type == "none"
    assert only.bridge_overrides() == ["model.context_parallel_size=1"]


@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("heads,kv", [(32, 8), (64, 8), (32, 32), (128, 8), (8, 2), (24, 24)])
def test_kept_iff_every_rule_holds(cp, tp, heads, kv):
    m = model(heads, kv)
    seq = 131072
    for c in enumerate_layouts(m, H100, cp=cp, tp=tp, seq=seq):
        tp_ok = heads % tp == 0 and kv % tp == 0
        rank = (heads // tp, kv // tp) if tp_ok else (0, 0)
        heads_ok = tp_ok and all(n % c.layout.a2a == 0 for n in rank)
        even_ok = c.layout.a2a == 1 or all(n % 2 == 0 for n in rank)
        heads_ok = heads_ok and even_ok
        assert c.kept == heads_ok, (c.layout, c.reasons)
        assert bool(c.reasons) == (not c.kept)
        crosses = c.layout.a2a > 1 and tp * c.layout.a2a > 8
        assert any("crosses nodes" in f for f in c.flags) == crosses
        assert c.groups.world_size == tp * cp


def test_pure_a2a_needs_heads_and_kv_heads_divisible_by_cp():
    (*_, a2a) = enumerate_layouts(model(32, 8), H100, cp=16, tp=1, seq=65536)
    assert a2a.layout == Layout(16, 1) and not a2a.kept
    assert a2a.reasons[0].startswith("[heads-a2a] a2a size 16 does not divide the per-TP-rank "
                                     "KV heads/tp = 8/1 = 8")
    (*_, ok) = enumerate_layouts(model(32, 8), H100, cp=8, tp=1, seq=65536)
    assert ok.layout == Layout(8, 1) and ok.kept


def test_kv_heads_rule_counts_per_tp_rank():
    by = {c.layout.a2a: c for c in enumerate_layouts(model(32, 8), H100, cp=8, tp=2, seq=65536)}
    assert by[4].kept  # 8 KV heads / tp 2 = 4 per rank, a2a 4 divides it
    assert not by[8].kept
    assert "KV heads/tp = 8/2 = 4" in by[8].reasons[0]


def test_seq_not_divisible_by_two_cp_rejects_every_layout_with_the_fix():
    cands = enumerate_layouts(model(32, 8), H100, cp=8, tp=1, seq=131000)
    assert not any(c.kept for c in cands)
    assert "seq 131000 is not divisible by 2*cp = 16" in cands[0].reasons[0]
    assert cands[0].reasons[0].endswith("fix: model.seq_length=131008 (or 130992)")
    assert all(c.kept for c in enumerate_layouts(model(32, 8), H100, cp=8, tp=1, seq=131072))


def test_tp_not_dividing_heads_is_a_reason():
    (c, *_) = enumerate_layouts(model(24, 24), H100, cp=2, tp=16, seq=4096)
    assert c.reasons[0].startswith("[heads-tp] tp=16 does not divide the heads (24)")


def test_odd_per_rank_heads_reject_a2a_layouts_on_te():
    # 12 heads at tp=4: 3 query and 3 KV heads per rank; a2a 3 divides them, 3 is odd
    by = {c.layout.a2a: c for c in enumerate_layouts(model(12, 12), H100, cp=6, tp=4, seq=12000)}
    assert by[1].kept and by[2].kept is False and by[6].kept is False
    assert not by[3].kept and by[3].reasons[0].startswith("[heads-even-a2a] odd per-TP-rank query")
    assert [f.rule for f in by[3].findings] == ["heads-even-a2a", "a2a-cross-node"]  # 4*3 > 8
    assert by[3].reasons[0].endswith("fix: model.cp_comm_type=p2p model.hierarchical_context_parallel_sizes=null")
    # at tp=2 the 6 heads per rank are even: a2a 3 is kept
    assert {c.layout.a2a: c.kept for c in enumerate_layouts(model(12, 12), H100, cp=6, tp=2, seq=12000)}[3]


def test_odd_heads_do_not_matter_off_te():
    cpu = ClusterProfile(name="c", device="cpu", gpu_name="cpu", gpus_per_node=8,
                         intra_node_bw_gbs=10, inter_node_bw_gbs=1, gpu_memory_gib=8)
    by = {c.layout.a2a: c for c in enumerate_layouts(model(12, 12), cpu, cp=6, tp=4, seq=12000)}
    assert by[3].kept  # the pure-torch reference splits any head count


def test_cross_node_a2a_is_flagged_or_dropped():
    kept = {c.layout.a2a: c for c in enumerate_layouts(model(64, 16), H100, cp=16, tp=1, seq=65536)}
    assert kept[16].kept and "tp*a2a = 1*16 = 16 > 8" in kept[16].flags[0]
    assert kept[8].kept and not kept[8].flags  # 8 ranks fit one node exactly
    dropped = {
        c.layout.a2a: c
        for c in enumerate_layouts(model(64, 16), H100, cp=16, tp=1, seq=65536,
                                   drop_cross_node_a2a=True)
    }
    assert not dropped[16].kept and "drop_cross_node_a2a=true" in dropped[16].reasons[0]
    assert dropped[8].kept


def g(*groups):
    return tuple(tuple(x) for x in groups)


# hcp-facts.md section 2, worked examples (global ranks)
@pytest.mark.parametrize(
    "tp,cp,dp,sizes,cp_groups,a2a,p2p",
    [
        (1, 8, 1, (2, 4), g(range(8)), g((0, 1), (2, 3), (4, 5), (6, 7)),
         g((0, 2, 4, 6), (1, 3, 5, 7))),
        (1, 8, 1, (4, 2), g(range(8)), g((0, 1, 2, 3), (4, 5, 6, 7)),
         g((0, 4), (1, 5), (2, 6), (3, 7))),
        (2, 8, 1, (2, 4), g(range(0, 16, 2), range(1, 16, 2)),
         g((0, 2), (4, 6), (8, 10), (12, 14), (1, 3), (5, 7), (9, 11), (13, 15)),
         g((0, 4, 8, 12), (2, 6, 10, 14), (1, 5, 9, 13), (3, 7, 11, 15))),
        (1, 4, 2, (2, 2), g(range(4), range(4, 8)), g((0, 1), (2, 3), (4, 5), (6, 7)),
         g((0, 2), (1, 3), (4, 6), (5, 7))),
        (1, 16, 1, (8, 2), g(range(16)), g(range(8), range(8, 16)),
         g(*[(i, i + 8) for i in range(8)])),
    ],
)
def test_rank_groups_match_megatron_core_worked_examples(tp, cp, dp, sizes, cp_groups, a2a, p2p):
    groups = rank_groups(Layout(*sizes), tp=tp, dp=dp, gpus_per_node=8)
    assert set(groups.cp) == set(cp_groups)
    assert set(groups.a2a) == set(a2a)
    assert set(groups.p2p) == set(p2p)


@pytest.mark.parametrize("tp,cp", [(1, 8), (2, 8), (4, 16), (8, 64)])
def test_every_rank_is_in_exactly_one_group_per_level(tp, cp):
    for layout in factorizations(cp):
        groups = rank_groups(layout, tp=tp, gpus_per_node=8)
        for level, size in (("a2a", layout.a2a), ("p2p", layout.p2p)):
            members = [r for grp in getattr(groups, level) for r in grp]
            assert sorted(members) == list(range(tp * cp))
            assert {len(grp) for grp in getattr(groups, level)} == {size}


def test_placement_says_which_level_crosses_nodes():
    # tp=1 cp=16 [8,2] on 8-GPU nodes: a2a inside a node, the ring crosses
    groups = rank_groups(Layout(8, 2), tp=1, gpus_per_node=8)
    assert not groups.a2a_crosses_nodes and groups.p2p_crosses_nodes
    assert groups.nodes == 2
    groups = rank_groups(Layout(2, 8), tp=2, gpus_per_node=8)
    assert not groups.a2a_crosses_nodes and groups.p2p_crosses_nodes
    single = rank_groups(Layout(2, 4), tp=1, gpus_per_node=8)
    assert not single.a2a_crosses_nodes and not single.p2p_crosses_nodes
    assert single.nodes == 1
    assert math.prod(Layout(2, 4).sizes) == 8


@pytest.mark.parametrize("tp,a2a,gpus_per_node,local", [
    (1, 8, 8, 8),  # inside a node: all 8 members together
    (2, 8, 8, 4),  # {0,2,..,14}: 4 on each of 2 nodes
    (4, 4, 8, 2),  # {0,4,8,12}: 2 on each of 2 nodes
    (8, 2, 8, 1),  # {0,8}: one per node
    (1, 8, 4, 4),  # 4-GPU nodes: 4 + 4
])
def test_a2a_members_per_node(tp, a2a, gpus_per_node, local):
    groups = rank_groups(Layout(a2a, 2), tp=tp, gpus_per_node=gpus_per_node)
    assert groups.a2a_members_per_node == local
    assert groups.a2a_crosses_nodes == (local < a2a)


def test_pipeline_stages_each_get_their_own_cp_groups_after_the_first_stage():
    g = rank_groups(Layout(2, 2), tp=1, dp=1, pp=2, gpus_per_node=8)
    assert g.cp == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert g.a2a == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert g.p2p == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert g.world_size == 8 and g.nodes == 1


def test_the_bridge_128k_recipe_world_is_64_ranks_on_8_nodes_with_p2p_crossing():
    g = rank_groups(Layout(2, 4), tp=4, dp=1, pp=2, gpus_per_node=8)
    assert g.world_size == 64 and g.nodes == 8
    assert (32, 36, 40, 44, 48, 52, 56, 60) in g.cp  # stage 1's first CP group
    assert not g.a2a_crosses_nodes and g.p2p_crosses_nodes


def test_stage_groups_are_stage_zeros_alone():
    from hcp_tune.space.layout import Candidate

    cand = Candidate(Layout(2, 2), tp=1, seq=4096, dp=1, kept=True, pp=2)
    assert cand.stage_groups(8) == rank_groups(Layout(2, 2), tp=1, gpus_per_node=8)
    assert cand.stage_groups(8).world_size == 4
