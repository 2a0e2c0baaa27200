"""The two-m fit (issue 19): a layout measured at m = pp and 3*pp, ``step = a + b*m``, ranked
at the user's m, on rows written and read back through the results store."""
from __future__ import annotations

import json

import pytest
from helpers import store

from hcp_tune.costmodel.microbatch import (
    fit_step,
    measure_points,
    rank_at,
    tokens_per_gpu_s,
)
from hcp_tune.store.records import TrialRow
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row
from hcp_tune.spec import Status, TrialResult, TrialSpec

PP, USER_M = 2, 512  # Bridge's 128K recipe: gbs 512, mbs 1, dp 1


def bridge_row(a2a: int, p2p: int, m: int, step_s: float, *, pp: int = PP, n: list = [0]):
    n[0] += 1
    key = SweepKey(cluster="dgx-h100", model="llama3-8b", tp=4, cp=a2a * p2p, seq=131072,
                   runner="bridge", env_tag="t", pp=pp, micro_batches=USER_M)
    spec = TrialSpec(trial_id=f"{key.slug}-t{n[0]:04d}", a2a=a2a, p2p=p2p, tp=4, pp=pp,
                     micro_batches=m, seq=131072, heads=32, kv_heads=8, head_dim=128,
                     runner="bridge")
    res = TrialResult(trial_id=spec.trial_id, status=Status.OK, median_s=step_s,
                      step_times_s=[step_s] * 3, verification={"cp_active": {
                          "checked": True, "problems": []}})
    row = trial_row(key, spec, res)
    assert row["measured_micro_batches"] == json.dumps([m])  # what the run ran, from its spec
    return row


@pytest.mark.parametrize("pp,user_m,points", [
    (2, 512, (2, 4, 6)), (4, 64, (4, 8, 12)), (1, 100, (1, 2, 3)),
    (4, 8, (8,)),  # 3*pp reaches the user's m: measure the user's m itself
    (2, 2, (2,)),
])
def test_points_are_multiples_of_pp_and_at_least_pp(pp, user_m, points):
    assert measure_points(pp, user_m) == points


def test_the_fit_goes_through_the_points_and_extrapolates():
    fit = fit_step([(2, 1.2), (6, 1.6)])
    assert fit.fixed_s == pytest.approx(1.0) and fit.per_micro_batch_s == pytest.approx(0.1)
    assert fit.step_s(512) == pytest.approx(52.2)
    with pytest.raises(ValueError, match=r"two micro-batch counts, got m=\[2\]"):
        fit_step([(2, 1.0), (2, 1.1)])


def test_the_ranking_at_the_users_m_can_reverse_the_short_runs(tmp_path):
    # [1,8]: a large fixed part (its DP collectives share the links), fast micro-batches;
    # [2,4]: a small fixed part, slower micro-batches. At m = pp [2,4] looks 2.7x faster;
    # at the user's m = 512 it is 18% slower.
    rows = [bridge_row(1, 8, 2, 1.0 + 0.10 * 2), bridge_row(1, 8, 6, 1.0 + 0.10 * 6),
            bridge_row(2, 4, 2, 0.2 + 0.12 * 2), bridge_row(2, 4, 6, 0.2 + 0.12 * 6)]
    stored = ResultStore(store(tmp_path / "res", rows)).rows()  # as written and read back
    short = sorted((r for r in stored if r["measured_micro_batches"] == f"[{PP}]"),
                   key=lambda r: r["median_s"])
    assert (short[0]["a2a"], short[0]["p2p"]) == (2, 4)
    ranked = rank_at(stored, USER_M, seq=131072)
    assert [(r["a2a"], r["p2p"]) for r in ranked] == [(1, 8), (2, 4)]
    assert ranked[0]["step_at_user_m_s"] == pytest.approx(52.2)
    assert ranked[0]["fit"]["points"] == [[2, 1.2], [6, 1.6]]
    assert ranked[1]["step_at_user_m_s"] / ranked[0]["step_at_user_m_s"] == pytest.approx(
        61.64 / 52.2)


def test_keys_with_different_pp_compare_by_tokens_per_gpu(tmp_path):
    # pp=1 has half the GPUs: a longer step can still train more tokens per GPU
    rows = [bridge_row(2, 4, 1, 0.28, pp=1), bridge_row(2, 4, 3, 0.64, pp=1),
            bridge_row(2, 4, 2, 0.45), bridge_row(2, 4, 6, 0.85)]
    ranked = rank_at(ResultStore(store(tmp_path / "res", rows)).rows(), USER_M, seq=131072)
    by_pp = {r["pp"]: r for r in ranked}
    assert by_pp[1]["step_at_user_m_s"] > by_pp[2]["step_at_user_m_s"]
    assert ranked[0]["pp"] == 1
    assert by_pp[1]["tokens_per_gpu_s"] == pytest.approx(tokens_per_gpu_s(
        by_pp[1]["step_at_user_m_s"], m=USER_M, mbs=1, dp=1, seq=131072, world=32))


def test_a_layout_measured_at_one_m_is_not_ranked():
    assert rank_at([bridge_row(1, 8, 2, 1.2)], USER_M) == []


def test_a_row_stored_with_one_integer_m_reads_as_a_list_of_it():
    row = bridge_row(1, 8, 2, 1.2)
    older = {**row, "measured_micro_batches": 2}
    del older["point_medians_s"]
    assert TrialRow.from_dict(older).measured_micro_batches == "[2]"
    assert rank_at([TrialRow.from_dict(older).to_dict(), bridge_row(1, 8, 6, 1.6)],
                   USER_M)[0]["step_at_user_m_s"] == pytest.approx(52.2)


def test_a_sweep_row_carries_both_points_and_ranks_on_its_own(tmp_path):
    """The sweep's row of a runner=bridge trial (both runs combined, engine/trials.combine)
    holds both m and their medians: one row is enough to fit and rank its layout."""
    fields = {"measured_micro_batches": "[2, 6]", "point_medians_s": "[1.2, 1.6]"}
    rows = [{**bridge_row(1, 8, USER_M, 52.2), **fields, "trial_id": "x-t1"},
            {**bridge_row(2, 4, USER_M, 61.64), "measured_micro_batches": "[2, 6]",
             "point_medians_s": "[0.44, 0.92]", "trial_id": "x-t2"}]
    ranked = rank_at(ResultStore(store(tmp_path / "res", rows)).rows(), USER_M, seq=131072)
    assert [(r["a2a"], r["p2p"]) for r in ranked] == [(1, 8), (2, 4)]
    assert ranked[0]["fit"]["points"] == [[2, 1.2], [6, 1.6]]
    assert ranked[1]["step_at_user_m_s"] == pytest.approx(61.64)
