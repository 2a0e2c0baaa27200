"""The cost model: units, hand-computed numbers, monotonic properties, published guidance."""
import dataclasses
import functools

import pytest
from helpers import cand

from hcp_tune import config
from hcp_tune.costmodel.formulas import (
    GIB,
    CostParams,
    predict,
    predict_attention_layer,
)
from hcp_tune.flops import causal_attention_flops, layer_gemm_flops, lm_head_flops
from hcp_tune.space.layout import enumerate_layouts


@functools.lru_cache(maxsize=None)
def profiles(cluster="dgx-h100", model="llama3-8b"):
    cfg = config.load([f"cluster={cluster}", f"model={model}"])
    return cfg.model, cfg.cluster


NO_STEP_OVERHEAD = CostParams(ring_step_overhead_us=0.0, ring_merge_bytes_per_element=0.0)


def kept(model, cluster, *, cp, seq, tp=1):
    return [c for c in enumerate_layouts(model, cluster, cp=cp, tp=tp, seq=seq) if c.kept]


# ------------------------------------------------------------------ FLOPs by hand

def test_causal_flops_match_hand_computation():
    # 4 * 1024^2 * 2 heads * 4 head_dim * 1 / 2 = 16,777,216; backward 2.5x
    assert causal_attention_flops(1024, 2, 4, 1) == (16_777_216.0, 41_943_040.0)


def test_causal_flops_scale_with_seq_squared_and_mbs():
    f1, _ = causal_attention_flops(1000, 8, 64, 1)
    f2, _ = causal_attention_flops(2000, 8, 64, 3)
    assert f2 == pytest.approx(12 * f1)


def test_gemm_flops_match_hand_computation():
    # hidden 4, head_dim 2, heads 2, kv 1 -> attn 4*2*(4+2)=48; mlp 3*4*8=96; 2*10*(144)
    assert layer_gemm_flops(10, 4, 8, 2, 1, 2) == 2880.0
    assert lm_head_flops(10, 4, 100) == 8000.0


# ------------------------------------------------------------------ units

def test_breakdown_sums_to_step_time_and_memory_total():
    model, cluster = profiles()
    p = predict(model, cluster, cand(2, 4, seq=131072))
    assert p.step_time_s == pytest.approx(p.compute_s + p.exposed_a2a_s + p.exposed_p2p_s + p.other_s)
    assert p.memory_gib == pytest.approx(p.memory.total_gib)
    assert p.label == "predicted (uncalibrated defaults)"


def test_attention_compute_seconds_by_hand():
    model, cluster = profiles()
    params = CostParams(layer_overhead_us=0.0)
    p = predict_attention_layer(model, cluster, cand(8, 1, seq=131072), params=params)
    fwd, bwd = causal_attention_flops(131072, 32, 128, 1)
    eff = 0.5 * 131072 / (131072 + 512)  # no loss for the 4 heads per rank by default
    assert p.compute_s == pytest.approx((fwd + bwd) / 8 / (989e12 * eff))


def test_a2a_seconds_by_hand():
    # cp=8 [8,1], seq 131072: local chunk 16384 tokens; Q,O 32 heads, K,V 8 heads, bf16.
    model, cluster = profiles()
    params = CostParams(latency_multiplier=1e-12, small_message_half_bytes=0.0)
    p = predict_attention_layer(model, cluster, cand(8, 1, seq=131072), params=params)
    q = 16384 * 32 * 128 * 2
    kv = 16384 * 8 * 128 * 2
    moved = 7 / 8 * 2 * (2 * q + 2 * kv)  # forward Q,K,V,O and backward dO,dQ,dK,dV
    assert p.exposed_a2a_s == pytest.approx(moved / (450e9 * 0.8), rel=1e-6)


def test_doubling_bandwidth_halves_exposed_a2a():
    model, cluster = profiles()
    fast = dataclasses.replace(cluster, intra_node_bw_gbs=2 * cluster.intra_node_bw_gbs)
    params = CostParams(latency_multiplier=1e-12, small_message_half_bytes=0.0)
    c = cand(4, 2, seq=65536)
    slow_p = predict(model, cluster, c, params=params)
    fast_p = predict(model, fast, c, params=params)
    assert fast_p.exposed_a2a_s == pytest.approx(slow_p.exposed_a2a_s / 2, rel=1e-6)


def test_doubling_bandwidth_halves_exposed_p2p_when_bandwidth_bound():
    model, cluster = profiles()
    # compute made negligible: the ring is all communication
    cluster = dataclasses.replace(cluster, peak_bf16_tflops=1e12)
    fast = dataclasses.replace(cluster, intra_node_bw_gbs=2 * cluster.intra_node_bw_gbs)
    params = NO_STEP_OVERHEAD.replace(latency_multiplier=1e-12)
    c = cand(1, 8, seq=65536)
    slow_p = predict_attention_layer(model, cluster, c, params=params)
    fast_p = predict_attention_layer(model, fast, c, params=params)
    assert fast_p.exposed_p2p_s == pytest.approx(slow_p.exposed_p2p_s / 2, rel=1e-3)


def test_ring_hidden_behind_long_compute_leaves_only_last_handback():
    model, cluster = profiles()
    params = NO_STEP_OVERHEAD.replace(latency_multiplier=1e-12)
    p = predict_attention_layer(model, cluster, cand(1, 8, seq=131072), params=params)
    block = 2 * 16384 * 8 * 128 * 2  # K+V of the local chunk
    assert p.exposed_p2p_s == pytest.approx(block / (450e9 * 0.8), rel=1e-6)


def test_memory_terms_by_hand():
    model, cluster = profiles()
    p = predict(model, cluster, cand(2, 4, seq=131072))
    n = model.params
    assert p.memory.weights_gib == pytest.approx(n * 2 / GIB)
    assert p.memory.grads_gib == pytest.approx(n * 4 / GIB)
    assert p.memory.optimizer_gib == pytest.approx(n * 12 / 8 / GIB)  # sharded over dp*cp
    assert p.memory.a2a_buffers_gib > 0 and p.memory.p2p_buffers_gib > 0
    pure = predict(model, cluster, cand(8, 1, seq=131072))
    assert pure.memory.p2p_buffers_gib == 0
    assert predict(model, cluster, cand(1, 8, seq=131072)).memory.a2a_buffers_gib == 0


def test_tp_collectives_only_with_tp():
    model, cluster = profiles()
    p1 = predict(model, cluster, cand(2, 4, seq=65536, tp=1))
    p2 = predict(model, cluster, cand(2, 4, seq=65536, tp=2))
    assert p2.other_s < p1.other_s  # GEMMs halve, TP collectives added
    assert p2.memory.weights_gib == pytest.approx(p1.memory.weights_gib / 2)


def test_cpu_profile_label_says_nominal():
    model, cluster = profiles("local", "tiny")
    p = predict_attention_layer(model, cluster, cand(2, 2, seq=1024))
    assert "uncalibrated; CPU nominal 10 GFLOP/s/core" in p.label


def test_calibrated_label_names_the_source():
    model, cluster = profiles()
    params = CostParams(source="calibrated 2026-12-02 dgx-h100/te-2.9 on 12 rows")
    p = predict(model, cluster, cand(2, 4, seq=65536), params=params)
    assert p.label == "predicted (calibrated 2026-12-02 dgx-h100/te-2.9 on 12 rows)"


@pytest.mark.parametrize("field,value,msg", [
    ("compute_efficiency", 0.0, "compute_efficiency must be > 0, but got value=0.0"),
    ("inter_bw_efficiency", -1.0, "inter_bw_efficiency must be > 0"),
    ("layer_overhead_us", -1.0, "layer_overhead_us must be >= 0"),
    ("ring_step_overhead_us", -1.0, "ring_step_overhead_us must be >= 0, but got value=-1.0"),
    ("half_efficiency_heads", -0.5, "half_efficiency_heads must be >= 0"),
])
def test_cost_params_reject_bad_values(field, value, msg):
    with pytest.raises(ValueError, match=msg):
        CostParams(**{field: value})


def test_illegal_seq_is_refused_with_reason():
    model, cluster = profiles()
    with pytest.raises(ValueError, match="not divisible by 2\\*cp = 16"):
        predict(model, cluster, cand(2, 4, seq=1000))


# ------------------------------------------------------------------ monotonic properties

LAYOUTS = [(1, 8), (2, 4), (4, 2), (8, 1), (1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]


@pytest.mark.parametrize("a2a,p2p", LAYOUTS)
@pytest.mark.parametrize("seq", [8192, 131072])
@pytest.mark.parametrize("predictor", [predict, predict_attention_layer])
def test_fewer_gpus_per_node_is_never_faster(a2a, p2p, seq, predictor):
    """Moving levels from intra-node to inter-node links never makes a layout faster."""
    model, cluster = profiles("dgx-h100", "llama2-7b")  # 32 kv heads: every a2a size legal
    times = []
    for g in (16, 8, 4, 2, 1):
        c = cand(a2a, p2p, seq=seq, gpus_per_node=g)
        times.append(predictor(model, dataclasses.replace(cluster, gpus_per_node=g), c).step_time_s)
    assert times == sorted(times)


@pytest.mark.parametrize("a2a,p2p", LAYOUTS)
@pytest.mark.parametrize("cluster_name", ["dgx-h100", "dgx-a100", "local"])
def test_longer_sequences_are_never_faster(a2a, p2p, cluster_name):
    model, cluster = profiles(cluster_name, "llama2-7b")
    cp = a2a * p2p
    seqs = [2 * cp * k for k in (16, 64, 256, 1024, 4096)] + [131072, 262144]
    times = [predict(model, cluster, cand(a2a, p2p, seq=s)).step_time_s for s in seqs]
    assert times == sorted(times)


@pytest.mark.parametrize("seq", [8192, 32768, 131072])
def test_a2a_group_across_nodes_is_penalized(seq):
    # cp=16 tp=2 [8,2]: tp*a2a = 16 > 8 GPUs per node, the all-to-all leaves the node
    model, cluster = profiles("dgx-h100", "llama2-7b")
    crossing = cand(8, 2, seq=seq, tp=2, gpus_per_node=8)
    assert crossing.groups.a2a_crosses_nodes
    inside = cand(8, 2, seq=seq, tp=2, gpus_per_node=16)
    big_node = dataclasses.replace(cluster, gpus_per_node=16)
    assert not inside.groups.a2a_crosses_nodes
    p_cross = predict(model, cluster, crossing)
    p_in = predict(model, big_node, inside)
    # crossing: half of each tensor leaves the node (4 of 8 members per node) at 50 GB/s;
    # inside: 7/8 of it over NVLink at 450 GB/s
    assert p_cross.terms.a2a_volume_s == pytest.approx(
        (1 / 2) / 50 / ((7 / 8) / 450) * p_in.terms.a2a_volume_s)
    assert p_cross.exposed_a2a_s > p_in.exposed_a2a_s
    assert p_cross.step_time_s > p_in.step_time_s


# ------------------------------------------------------------------ published guidance (facts s.6)

@pytest.mark.parametrize("cluster_name,model_name,cp,tp,seq", [
    ("dgx-h100", "llama3-8b", 8, 1, 8192),
    ("dgx-h100", "llama2-7b", 8, 1, 8192),
    ("dgx-h100", "llama2-7b", 8, 1, 16384),
    ("dgx-a100", "llama2-7b", 8, 1, 8192),
    ("dgx-h100", "llama3-8b", 16, 2, 8192),
    ("dgx-h100", "llama3-70b", 32, 2, 32768),
])
def test_pure_ring_is_worst_when_chunks_are_short(cluster_name, model_name, cp, tp, seq):
    model, cluster = profiles(cluster_name, model_name)
    times = {c.layout.a2a: predict(model, cluster, c).step_time_s
             for c in kept(model, cluster, cp=cp, tp=tp, seq=seq)}
    assert len(times) >= 3
    assert max(times, key=times.get) == 1, times


@pytest.mark.parametrize("cluster_name,model_name,cp,seq", [
    ("dgx-h100", "llama3-8b", 2, 131072),
    ("dgx-h100", "llama3-8b", 4, 131072),
    ("dgx-h100", "llama3-8b", 4, 65536),
    ("dgx-a100", "llama2-7b", 4, 131072),
])
def test_ring_is_competitive_at_small_cp_with_long_chunks(cluster_name, model_name, cp, seq):
    model, cluster = profiles(cluster_name, model_name)
    times = {c.layout.a2a: predict(model, cluster, c).step_time_s
             for c in kept(model, cluster, cp=cp, seq=seq)}
    assert times[1] <= 1.02 * min(times.values()), times


def test_short_chunks_prefer_a2a_size_4_or_8_on_nvlink():
    model, cluster = profiles("dgx-h100", "llama2-7b")
    times = {c.layout.a2a: predict(model, cluster, c).step_time_s
             for c in kept(model, cluster, cp=8, seq=8192)}
    assert min(times, key=times.get) in (4, 8), times
