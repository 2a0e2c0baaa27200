"""The cost model's second-pass terms (issue 13): all-to-all messages, shared node links,
ring step overhead, heads per rank, forward-only; each by hand and by a monotonic property."""
import dataclasses
import functools

import pytest
from helpers import cand

from hcp_tune import config
from hcp_tune.costmodel.formulas import CostParams, predict, predict_attention_layer
from hcp_tune.errors import ConfigError
from hcp_tune.flops import causal_attention_flops


@functools.lru_cache(maxsize=None)
def profiles(cluster="dgx-h100", model="llama2-7b"):
    cfg = config.load([f"cluster={cluster}", f"model={model}"])
    return cfg.model, cfg.cluster


SPLITS8 = [(1, 8), (2, 4), (4, 2), (8, 1)]
PREDICTORS = [predict, predict_attention_layer]


# ------------------------------------------------------------------ the breakdown

@pytest.mark.parametrize("cluster_name", ["dgx-h100", "pcie-a100", "pcie-l20", "local"])
@pytest.mark.parametrize("a2a,p2p", SPLITS8)
@pytest.mark.parametrize("predictor", PREDICTORS)
def test_terms_add_up_to_the_breakdown(cluster_name, a2a, p2p, predictor):
    model, cluster = profiles(cluster_name)
    p = predictor(model, cluster, cand(a2a, p2p, seq=32768))
    t = p.terms
    assert p.compute_s == pytest.approx(t.compute_ideal_s + t.compute_short_block_s
                                        + t.compute_few_heads_s, rel=1e-9)
    assert p.exposed_a2a_s == pytest.approx(t.a2a_volume_s + t.a2a_messages_s
                                            + t.a2a_shared_link_s, rel=1e-9, abs=1e-15)
    assert p.exposed_p2p_s == pytest.approx(t.ring_transfer_s + t.ring_step_overhead_s,
                                            rel=1e-9, abs=1e-15)
    assert (t.a2a_messages_s > 0) == (a2a > 1) and (p.exposed_p2p_s > 0) == (p2p > 1)
    assert t.ring_step_overhead_s >= 0  # hidden when the ring waits on transfers (PCIe)


# ------------------------------------------------------------------ each term by hand

def test_a2a_messages_by_hand():
    # cp=8 [8,1]: each of the 8 collectives sends 7 messages of latency + m_half / bandwidth
    model, cluster = profiles()
    p = predict_attention_layer(model, cluster, cand(8, 1, seq=131072))
    per_message = 5e-6 + 1024**2 / (450e9 * 0.8)
    assert p.terms.a2a_messages_s == pytest.approx(8 * 7 * per_message)
    fwd = predict_attention_layer(model, cluster, cand(8, 1, seq=131072), forward_only=True)
    assert fwd.terms.a2a_messages_s == pytest.approx(4 * 7 * per_message)  # Q, K, V, O only


@pytest.mark.parametrize("tp,a2a,local", [(2, 8, 4), (4, 8, 2), (8, 4, 1)])
def test_a2a_across_nodes_by_hand(tp, a2a, local):
    # cp=8 on 8-GPU nodes: the a2a group takes every tp-th rank, so with tp*a2a > 8 it spans
    # tp*a2a/8 nodes with `local` members on each. Each rank sends V/a2a to each of its
    # a2a-1 peers: a2a - local of them on other nodes (the (k-1)/k share of V, over the
    # inter-node link, 50 GB/s x 0.8, 10 us each), local - 1 over NVLink at the same time;
    # the network part is the slower
    model, cluster = profiles()
    c = cand(a2a, 8 // a2a, seq=131072, tp=tp)
    assert c.groups.a2a_members_per_node == local
    p = predict_attention_layer(model, cluster, c)
    q = 131072 / 8 * 32 / tp * 128 * 2  # llama2-7b: Q = K = V = O in size, bf16
    remote = a2a - local
    assert p.terms.a2a_volume_s == pytest.approx(8 * remote / a2a * q / (50e9 * 0.8))
    assert p.terms.a2a_messages_s == pytest.approx(
        8 * remote * (10e-6 + 1024**2 / (50e9 * 0.8)))
    assert p.terms.a2a_shared_link_s == 0.0


def test_a2a_across_more_nodes_is_slower():
    # the cross-node share (k-1)/k and the remote peers grow with the nodes k the group spans
    model, cluster = profiles()
    times = [predict_attention_layer(model, dataclasses.replace(cluster, gpus_per_node=g),
                                     cand(8, 1, seq=131072, gpus_per_node=g)).exposed_a2a_s
             for g in (8, 4, 2, 1)]  # the group spans k = 1, 2, 4, 8 nodes
    assert times == sorted(times) and times[0] < times[1]


def test_shared_node_link_by_hand():
    # pcie-a100: 8 ranks share 128 GB/s -> 16 GB/s each (x 0.8) instead of the link's 32
    model, cluster = profiles("pcie-a100")
    p = predict_attention_layer(model, cluster, cand(8, 1, seq=65536))
    tokens = 65536 / 8
    q = tokens * 32 * 128 * 2  # llama2-7b: 32 heads = 32 kv heads, head_dim 128, bf16
    moved = 7 / 8 * 8 * q  # 8 tensors of Q's size
    assert p.terms.a2a_volume_s == pytest.approx(moved / (32e9 * 0.8))
    assert p.terms.a2a_shared_link_s == pytest.approx(moved / (16e9 * 0.8) - moved / (32e9 * 0.8))
    full_fabric = dataclasses.replace(cluster, node_aggregate_bw_gbs=None)
    assert predict_attention_layer(model, full_fabric, cand(8, 1, seq=65536)) \
        .terms.a2a_shared_link_s == 0.0


def test_a_ring_does_not_share_the_node_link():
    model, cluster = profiles("pcie-a100")
    capped = predict_attention_layer(model, cluster, cand(1, 8, seq=65536))
    free = predict_attention_layer(model, dataclasses.replace(cluster, node_aggregate_bw_gbs=None),
                                   cand(1, 8, seq=65536))
    assert capped.step_time_s == free.step_time_s and capped.exposed_p2p_s > 0


def test_no_few_heads_loss_by_default():
    # a flash kernel's grid (query tiles x batch x heads) is the same for every split of a
    # key: the defaults charge nothing for few heads per rank
    model, cluster = profiles()
    for a2a in (1, 2, 4, 8):
        p = predict_attention_layer(model, cluster, cand(a2a, 8 // a2a, seq=131072))
        assert p.terms.compute_few_heads_s == pytest.approx(0.0, abs=1e-12 * p.compute_s)


def test_few_heads_per_rank_by_hand():
    model, cluster = profiles()  # 32 heads: a2a 8 -> 4 heads per rank, a2a 1 -> 32
    params = CostParams(half_efficiency_tokens=1e-9, half_efficiency_heads=0.1)
    for a2a, heads in ((8, 4), (1, 32)):
        p = predict_attention_layer(model, cluster, cand(a2a, 8 // a2a, seq=131072), params=params)
        ideal = sum(causal_attention_flops(131072, 32, 128, 1)) / 8 / (989e12 * 0.5)
        assert p.terms.compute_ideal_s == pytest.approx(ideal)
        assert p.terms.compute_few_heads_s == pytest.approx(ideal * 0.1 / heads, rel=1e-6)


def test_ring_step_overhead_by_hand():
    # forward only, [4,2]: one step merges; compute-bound so nothing else is exposed
    model, cluster = profiles()
    params = CostParams(latency_multiplier=1e-12)
    p = predict_attention_layer(model, cluster, cand(4, 2, seq=131072), params=params,
                                forward_only=True)
    out_elems = 65536 * (32 / 4) * 128  # seq/p tokens x heads per rank x head_dim
    merge = out_elems * 12 / 3350e9
    assert p.terms.ring_step_overhead_s == pytest.approx(1 * (20e-6 + merge))
    assert p.terms.ring_transfer_s == pytest.approx(0.0, abs=1e-12)


def test_forward_only_counts_the_forward_pass_alone():
    model, cluster = profiles()
    both = predict_attention_layer(model, cluster, cand(2, 4, seq=65536))
    fwd = predict_attention_layer(model, cluster, cand(2, 4, seq=65536), forward_only=True)
    assert fwd.compute_s == pytest.approx(both.compute_s / 3.5)  # backward = 2.5x forward
    assert fwd.terms.a2a_volume_s == pytest.approx(both.terms.a2a_volume_s / 2)
    assert fwd.step_time_s < both.step_time_s


# ------------------------------------------------------------------ PCIe profiles

@pytest.mark.parametrize("name,peak,agg", [("pcie-a100", 312, 128), ("pcie-l20", 119.5, 128)])
def test_pcie_profiles_load_with_a_shared_node_link(name, peak, agg):
    _, cluster = profiles(name)
    assert cluster.peak_bf16_tflops == peak and cluster.node_aggregate_bw_gbs == agg
    assert cluster.intra_node_bw_gbs == 32  # PCIe Gen4 x16 one way


def test_bad_aggregate_bandwidth_is_one_line():
    with pytest.raises(ConfigError) as exc:
        config.load(["cluster=pcie-l20", "cluster.node_aggregate_bw_gbs=-5"])
    assert str(exc.value) == ("cluster.node_aggregate_bw_gbs=-5: expected null or a number "
                              "of GB/s > 0 (given on the command line)")


@pytest.mark.parametrize("cluster_name", ["pcie-a100", "pcie-l20"])
def test_pcie_long_chunks_prefer_narrow_a2a_and_ring_beats_wide_a2a(cluster_name):
    """hcp-facts.md section 6: on PCIe-only machines smaller a2a sizes win and pure ring
    can beat wide a2a."""
    model, cluster = profiles(cluster_name)
    times = {a: predict(model, cluster, cand(a, 8 // a, seq=131072)).step_time_s
             for a, _ in SPLITS8}
    assert min(times, key=times.get) in (1, 2), times
    assert times[1] < times[8], times


# ------------------------------------------------------------------ monotonic properties

@pytest.mark.parametrize("a2a", [2, 4, 8])
@pytest.mark.parametrize("seq", [8192, 131072])
@pytest.mark.parametrize("predictor", PREDICTORS)
def test_lower_aggregate_bandwidth_never_makes_an_a2a_cheaper(a2a, seq, predictor):
    model, cluster = profiles("pcie-a100")
    a2a_s, step_s = [], []
    for agg in (None, 1000, 256, 128, 64, 16):
        c = dataclasses.replace(cluster, node_aggregate_bw_gbs=agg)
        p = predictor(model, c, cand(a2a, 8 // a2a, seq=seq))
        a2a_s.append(p.exposed_a2a_s)
        step_s.append(p.step_time_s)
    assert a2a_s == sorted(a2a_s) and step_s == sorted(step_s)
    assert a2a_s[-1] > a2a_s[0]


@pytest.mark.parametrize("cluster_name", ["dgx-h100", "pcie-l20", "local"])
@pytest.mark.parametrize("a2a", [4, 8])
def test_shorter_chunks_never_make_a_wide_a2a_relatively_cheaper(cluster_name, a2a):
    """Per byte moved and against its own compute, the all-to-all costs more as the
    per-rank chunk shrinks (message latency and small-message bandwidth)."""
    model, cluster = profiles(cluster_name)
    per_byte, vs_compute = [], []
    for seq in (262144, 65536, 16384, 4096, 1024):
        p = predict_attention_layer(model, cluster, cand(a2a, 8 // a2a, seq=seq))
        per_byte.append(p.exposed_a2a_s / seq)  # bytes moved are proportional to seq
        vs_compute.append(p.exposed_a2a_s / p.compute_s)
    assert per_byte == sorted(per_byte) and vs_compute == sorted(vs_compute)
    assert per_byte[-1] > 1.5 * per_byte[0]


SLOWER = [  # (field, factor): each makes a link or the memory slower
    ("intra_node_bw_gbs", 0.5), ("inter_node_bw_gbs", 0.5), ("intra_node_latency_us", 4.0),
    ("inter_node_latency_us", 4.0), ("node_aggregate_bw_gbs", 0.25), ("hbm_bw_gbs", 0.5),
]


@pytest.mark.parametrize("field,factor", SLOWER)
@pytest.mark.parametrize("cluster_name", ["dgx-h100", "pcie-a100"])
@pytest.mark.parametrize("a2a,p2p,tp", [(1, 8, 1), (2, 4, 1), (4, 2, 1), (8, 1, 1), (4, 4, 2),
                                        (8, 2, 1)])
@pytest.mark.parametrize("seq", [8192, 131072])
def test_slower_links_never_make_anything_faster(field, factor, cluster_name, a2a, p2p, tp, seq):
    model, cluster = profiles(cluster_name)
    c = cand(a2a, p2p, seq=seq, tp=tp)
    value = getattr(cluster, field)
    slow = dataclasses.replace(cluster, **{field: value * factor if value else value})
    for predictor in PREDICTORS:
        fast_p, slow_p = predictor(model, cluster, c), predictor(model, slow, c)
        for name in ("step_time_s", "exposed_a2a_s", "exposed_p2p_s", "other_s"):
            assert getattr(slow_p, name) >= getattr(fast_p, name) * (1 - 1e-12), name


@pytest.mark.parametrize("a2a,p2p", SPLITS8)
def test_fewer_heads_per_rank_are_never_faster(a2a, p2p):
    model, cluster = profiles()
    times = [predict_attention_layer(model, cluster, cand(a2a, p2p, seq=65536),
                                     params=CostParams(half_efficiency_heads=h)).step_time_s
             for h in (0.0, 0.1, 0.5, 2.0)]
    assert times == sorted(times)
