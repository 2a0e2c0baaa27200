"""The cost model with pipeline stages and activation recompute (pipeline.py, costmodel.predict):
the schedule's arithmetic by hand, and monotonic properties of memory and time."""
from __future__ import annotations

import functools

import pytest

from hcp_tune import config
from hcp_tune.costmodel.formulas import predict
from hcp_tune.space.layout import Candidate, Layout, rank_groups
from hcp_tune.upstream.pipeline import (
    Recompute,
    bubble_fraction,
    in_flight,
    recomputed_layers,
    saved_activations,
    stage_layers,
)

FULL = Recompute("full", "uniform", 1)
SELECTIVE = Recompute("selective")


@functools.lru_cache(maxsize=None)
def profiles():
    cfg = config.load(["cluster=dgx-h100", "model=llama3-8b", "tp=1", "pp=1"])
    return cfg.model, cfg.cluster


def cand(*, tp=4, cp=8, a2a=2, pp=2, seq=131072):
    layout = Layout(a2a, cp // a2a)
    groups = rank_groups(layout, tp=tp, pp=pp, gpus_per_node=8)
    return Candidate(layout, tp, seq, 1, True, groups=groups, pp=pp)


def run(c, m=1, rc=Recompute()):
    model, cluster = profiles()
    return predict(model, cluster, c, micro_batches=m, recompute=rc)


def test_bubble_is_pp_minus_one_over_m_plus_pp_minus_one():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(2, 1) == pytest.approx(1 / 2)


def test_first_stage_keeps_min_pp_m_micro_batches_in_flight():
    assert [in_flight(4, m) for m in (1, 3, 4, 512)] == [1, 3, 4, 4]
    assert stage_layers(32, 2) == 16 and stage_layers(80, 3) == 27


def test_saved_activations_by_hand():
    # 8 layers of 10 bytes, inputs 1 byte, attention output 3 bytes
    assert saved_activations(10, 1, 3, 8, Recompute()) == 80
    assert saved_activations(10, 1, 3, 8, SELECTIVE) == 56
    assert saved_activations(10, 1, 3, 8, Recompute("full", "uniform", 2)) == 4 * 1 + 2 * 10
    assert saved_activations(10, 1, 3, 8, Recompute("full", "block", 3)) == 3 + 5 * 10 + 10
    assert recomputed_layers(8, Recompute("full", "block", 3)) == 3
    assert recomputed_layers(8, Recompute("full", "uniform", 2)) == 8
    assert recomputed_layers(8, SELECTIVE) == 0


def test_bad_recompute_settings_are_named():
    with pytest.raises(ValueError, match="recompute='some': expected none, selective or full"):
        Recompute("some")
    with pytest.raises(ValueError, match="recompute_num_layers must be >= 1"):
        Recompute("full", "uniform", 0)


def test_the_step_is_its_parts_and_its_parts_by_hand():
    p, one = run(cand(), m=8), run(cand(), m=1)
    parts = (p.compute_s + p.exposed_a2a_s + p.exposed_p2p_s + p.other_s + p.recompute_s
             + p.bubble_s + p.pp_send_s)
    assert p.step_time_s == pytest.approx(parts)
    slot = one.compute_s + one.exposed_a2a_s + one.exposed_p2p_s + one.other_s
    assert p.bubble_s == pytest.approx(slot)  # (pp-1) = 1 idle slot of one micro-batch
    assert p.compute_s == pytest.approx(8 * one.compute_s)
    assert p.pp_send_s == pytest.approx(8 * one.pp_send_s) and one.pp_send_s > 0
    flat = run(cand(pp=1), m=8)
    assert flat.bubble_s == flat.pp_send_s == 0


def test_more_stages_never_need_more_memory_and_halve_the_weights():
    mems = [run(cand(pp=pp), m=512) for pp in (1, 2, 4, 8)]
    totals = [m.memory_gib for m in mems]
    assert totals == sorted(totals, reverse=True)
    assert mems[1].memory.weights_gib < 0.6 * mems[0].memory.weights_gib


def test_the_bubble_grows_with_stages_and_shrinks_with_micro_batches():
    assert run(cand(pp=4), m=8).bubble_s > run(cand(pp=2), m=8).bubble_s
    few, many = run(cand(pp=4), m=4), run(cand(pp=4), m=64)
    assert many.bubble_s / many.step_time_s < few.bubble_s / few.step_time_s


def test_recompute_trades_memory_for_time():
    none, sel, full = (run(cand(tp=1, pp=1), rc=rc) for rc in (Recompute(), SELECTIVE, FULL))
    assert none.memory.activations_gib > sel.memory.activations_gib > full.memory.activations_gib
    assert none.step_time_s < sel.step_time_s < full.step_time_s
    assert none.recompute_s == 0 and full.recompute_s > sel.recompute_s > 0


def test_the_bridge_128k_recipe_fits_80_gib_and_tp1_alone_does_not():
    assert run(cand(), m=512).memory_gib < 80
    assert run(cand(tp=1, pp=1, a2a=2), m=512).memory_gib > 80
