"""The cost model against published split measurements (the yunchang table) and TE's
attention study pattern (P2P wins most CP2 cases, A2A most CP4 and CP8 cases), per cluster.

Targets on the yunchang 8x A100 table (forward only): mean Kendall tau >= 0.7, predicted
best in the measured top two in 5/5 rows, predicted best at most 5% slower than the
measured best. The uncalibrated defaults reach the tau target (0.73) but not the other
two (4/5, 39%); a calibration on the whole table reaches all three in-sample; a calibration on four rows predicting the
fifth (leave one row out) misses the tau and top-two targets. The tests assert what each
reaches, so a regression shows; docs/guides/cost-model.md says what stands in the way.
"""
import functools
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.costmodel import agreement, calibrate
from hcp_tune.costmodel.agreement import kendall_tau
from hcp_tune.costmodel.formulas import CostParams

REPO = Path(__file__).resolve().parents[2]
YUNCHANG = REPO / "benchmarks" / "published" / "yunchang-a100-fwd.jsonl"
STORED = REPO / "benchmarks" / "published"


@functools.lru_cache(maxsize=None)
def rows():
    return tuple(calibrate.read_rows(str(YUNCHANG)))


def summary(result):
    taus = [k.tau for k in result]
    return (sum(taus) / len(taus), sum(k.best_in_top_two for k in result),
            max(k.slowdown for k in result))


# ------------------------------------------------------------------ the measures

def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(4 / 6)


def test_kendall_tau_needs_equal_lengths():
    with pytest.raises(ValueError, match="same length >= 2, got 3 and 2"):
        kendall_tau([1, 2, 3], [1, 2])


def test_key_agreement_by_hand():
    k = agreement.KeyAgreement(key="k", a2a_sizes=(8, 4, 2, 1), measured_s=(4.2, 1.72, 2.4, 4.07),
                               predicted_s=(3.0, 2.0, 1.0, 4.0))
    assert k.measured_order == [4, 2, 1, 8] and k.predicted_order == [2, 4, 8, 1]
    assert k.best_in_top_two and k.slowdown == pytest.approx(2.4 / 1.72 - 1)
    assert k.tau == pytest.approx((4 - 2) / 6)


def test_the_table_is_read_as_published():
    r = rows()
    assert len(r) == 20 and {x["passes"] for x in r} == {"fwd"} and {x["mbs"] for x in r} == {2}
    first = [x for x in r if x["seq"] == 8192]
    assert [x["it_per_s"] for x in first] == [237.874, 581.26, 417.267, 245.756]
    assert all(x["median_s"] == pytest.approx(1 / x["it_per_s"]) for x in r)


# ------------------------------------------------------------------ the check

def test_uncalibrated_defaults_on_the_yunchang_table():
    """Mean tau 0.73 since the defaults charge nothing for few heads per rank (a flash
    kernel's grid is the same for every split of a key); they still know nothing of
    yunchang's Python ring (per-step overhead and unfused merges, which the calibration
    finds) and pick [2,4] at 8K (39% slower), and at 128K with 8 heads they pick a2a 8, which
    measured third (4.4% slower than the best)."""
    tau, top2, worst = summary(agreement.agreement(list(rows()), CostParams()))
    assert tau >= 0.7 and top2 >= 4
    assert worst < 0.40


def test_stored_calibration_meets_the_targets_in_sample():
    params = calibrate.load_params(STORED, "dgx-a100", "yunchang-fwd")
    assert params is not None and params.source.startswith("calibrated")
    tau, top2, worst = summary(agreement.agreement(list(rows()), params))
    assert tau >= 0.7 and top2 == 5 and worst <= 0.05


def test_calibration_on_other_rows_predicts_each_held_out_row():
    """Leave one row out: fit on four rows, order the fifth. Held out, mean tau is 0.60
    (target 0.7) and 4/5 rows have the predicted best in the top two (target 5/5): the
    8-head row's 1-head-per-rank penalty is not learnt from the other rows."""
    r = list(rows())
    keys = agreement.keys_of(r)
    held = []
    for key in dict.fromkeys(keys):
        params, _ = calibrate.fit([x for x, k in zip(r, keys) if k != key], n_starts=1)
        held += agreement.agreement([x for x, k in zip(r, keys) if k == key], params)
    tau, top2, worst = summary(held)
    assert len(held) == 5
    assert tau >= 0.55 and top2 >= 4 and worst <= 0.05


def test_within_key_rows_fit_ratios_not_levels():
    """A table whose rows are not comparable with each other: scaling one key's measured
    times changes nothing in the fit."""
    r = list(rows())
    scaled = [{**x, "median_s": x["median_s"] * (3.0 if x["seq"] == 8192 else 1.0)} for x in r]
    a = calibrate.fit_report(r, CostParams())
    b = calibrate.fit_report(scaled, CostParams())
    assert [x["rel_error"] for x in a.per_row] == pytest.approx([x["rel_error"] for x in b.per_row])
    plain = [{k: v for k, v in x.items() if k != "compare"} for x in scaled]
    assert calibrate.fit_report(plain, CostParams()).rms_rel_error != pytest.approx(b.rms_rel_error)


def test_a_bad_passes_value_is_one_line():
    bad = [{**rows()[0], "passes": "bwd"}]
    with pytest.raises(ValueError, match="row passes='bwd': expected one of fwd\\+bwd, fwd"):
        calibrate.fit_report(bad, CostParams())


# ------------------------------------------------------------------ TE's study pattern

@functools.lru_cache(maxsize=None)
def te_clusters():
    return {n: config.load([f"cluster={n}"]).cluster for n in agreement.TE_STUDY_CLUSTERS}


H100_CP2 = pytest.mark.xfail(strict=True, reason=(
    "the uncalibrated model prefers a2a at CP2 on dgx-h100 in 10 of 10 cases, all within 1.9% "
    "(TE calls results within 3% near-ties); TE's study saw P2P win most CP2 cases"))
GB200_CP2 = pytest.mark.xfail(strict=True, reason=(
    "the uncalibrated model calls CP2 on gb200-nvl72 a tie: a2a ahead in 9 of 10 cases, all "
    "within 0.2% (TE calls results within 3% near-ties; with the former 9% charge for one "
    "head per rank p2p was ahead by 0.1-0.4%); TE's study saw P2P win most CP2 cases"))


@pytest.mark.parametrize("cluster", agreement.TE_STUDY_CLUSTERS)
@pytest.mark.parametrize("cp,winner", [(2, "p2p"), (4, "a2a"), (8, "a2a")])
def test_te_study_pattern_p2p_at_cp2_a2a_at_cp4_and_cp8(request, cluster, cp, winner):
    """Each cluster on its own: pooling them would let one cluster's agreement hide the
    other's disagreement (H100 and GB200 at CP2, marked as known expected failures: near-ties)."""
    if (cluster, cp) == ("dgx-h100", 2):
        request.applymarker(H100_CP2)
    if (cluster, cp) == ("gb200-nvl72", 2):
        request.applymarker(GB200_CP2)
    wins = agreement.te_study_winners(cp, {cluster: te_clusters()[cluster]})
    assert sum(wins[cluster].values()) == 10
    assert wins[cluster][winner] > 5, wins
