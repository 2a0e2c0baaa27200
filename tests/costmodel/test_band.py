"""The cost model's band (costmodel/band.py), the too-close-to-call group in ``predict``
and the ``sweep`` command printed to settle it (which must plan exactly the group)."""
import json
import math
import shlex

import pytest

from hcp_tune import config
from hcp_tune.costmodel import band, predict
from hcp_tune.costmodel.band import Band
from hcp_tune.space import plan


def test_pair_errors_compare_predicted_and_measured_ratios():
    # measured 1 : 2, predicted 1 : 1.5 -> |log 1.5 - log 2| for the one pair
    assert band.pair_errors([1.0, 2.0], [3.0, 4.5]) == [pytest.approx(math.log(2 / 1.5))]
    assert band.pair_errors([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="as many measured as predicted"):
        band.pair_errors([1.0], [1.0, 2.0])


def test_best_pair_errors_count_only_overstating_another_layout_against_the_best():
    # predicted best is index 0; layout 1 measured 1.2x slower but predicted 1.5x: overstated
    # by log(1.5/1.2); layout 2 measured 3x, predicted 2x: understated, error 0
    errs = band.best_pair_errors([1.0, 1.2, 3.0], [1.0, 1.5, 2.0])
    assert errs == [pytest.approx(math.log(1.5 / 1.2)), 0.0]


def test_quantile_interpolates_and_refuses_empty_or_bad_q():
    assert band.quantile([0.0, 1.0, 2.0, 3.0], 0.5) == pytest.approx(1.5)
    assert band.quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError, match="0 <= q <= 1"):
        band.quantile([], 0.5)
    with pytest.raises(ValueError, match="q=1.5"):
        band.quantile([1.0], 1.5)


def test_close_group_holds_what_is_within_the_band_of_the_best_fastest_first():
    times = {8: 1.00, 4: 1.04, 2: 1.06, 1: 1.30}
    b = Band(width=math.log(1.05))
    assert band.close_group(times, b) == [8, 4]  # 1.06 is outside 1.05x
    assert band.close_group(times, Band(width=0.0)) == [8]  # a confident pick
    assert band.close_group({}, b) == []


def test_the_measured_best_is_in_the_group_when_its_own_error_is_within_the_band():
    measured = {1: 1.0, 2: 0.9, 4: 1.5}  # a2a=2 is the measured best
    predicted = {1: 1.0, 2: 1.08, 4: 1.2}  # the model picks a2a=1
    err = dict(zip([2, 4], band.best_pair_errors([measured[a] for a in (1, 2, 4)],
                                                 [predicted[a] for a in (1, 2, 4)])))
    assert 2 in band.close_group(predicted, Band(width=err[2]))
    assert err[2] > math.log(1.08)  # the guarantee is one way: within its error suffices,
    assert 2 not in band.close_group(predicted, Band(width=math.log(1.07)))  # not needed


def test_measured_best_allows_for_the_source_noise():
    assert band.measured_best({8: 1.00, 4: 1.015, 2: 1.03}, 0.02) == {8, 4}
    assert band.measured_best({8: 1.00, 4: 1.015, 2: 1.03}, 0.0) == {8}


def _shipped_file(tmp_path, nvlink_keys: int):
    doc = {"defaults": {
        "pooled": {"width_log": 0.1, "q": 0.9, "keys": 12, "pairs": 30},
        "by_class": {"nvlink": {"width_log": 0.05, "q": 0.9, "keys": nvlink_keys, "pairs": 20}}}}
    path = tmp_path / "bands.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_hardware_class_gets_its_own_band_only_with_enough_keys(tmp_path):
    nvlink = config.load(["cluster=dgx-a100"]).cluster
    pcie = config.load(["cluster=pcie-a100"]).cluster
    own = band.shipped(nvlink, path=_shipped_file(tmp_path, band.MIN_KEYS))
    assert own.width == 0.05 and own.source.startswith("nvlink band")
    few = band.shipped(nvlink, path=_shipped_file(tmp_path, band.MIN_KEYS - 1))
    assert few.width == 0.1
    assert f"nvlink: {band.MIN_KEYS - 1} keys < {band.MIN_KEYS}" in few.source
    assert band.shipped(pcie, path=_shipped_file(tmp_path, 99)).source.startswith("pooled")


def test_the_shipped_band_is_package_data_and_pooled_while_keys_are_few():
    b = band.shipped(config.load(["cluster=dgx-a100"]).cluster)
    assert b.q == band.Q and b.keys >= 7 and b.pairs > b.keys and b.width >= 0


def test_a_calibration_band_needs_enough_keys():
    per_row = [{"tp": 1, "cp": 8, "seq": s, "measured_s": m, "predicted_s": p}
               for s in range(band.MIN_KEYS) for m, p in ((1.0, 1.0), (1.2, 1.5))]
    b = band.of_rows(per_row)
    assert b.keys == band.MIN_KEYS and b.width == pytest.approx(math.log(1.5 / 1.2))
    assert band.of_calibration({"fit": {"band": b.as_dict()}}).width == b.width
    small = band.of_rows(per_row[:4]).as_dict()
    assert band.of_calibration({"fit": {"band": small}}) is None
    assert band.of_calibration({"fit": {}}) is None


# inside the band's domain (A100 NVLink, one node, attention): the band decides the group
CFG = ["cluster=dgx-a100", "model=llama3-8b", "cp=8", "seq=[16384,32768]", "tp=1", "pp=1"]


def test_predict_json_carries_each_key_group_and_the_band():
    cfg = config.load(CFG)
    out = predict.predict_rows(cfg)
    assert set(out["band"]) == {"width_log", "factor", "q", "keys", "pairs", "source"}
    groups = {(g["seq"], g["tp"]): g for g in out["close_groups"]}
    assert set(groups) == {(16384, 1), (32768, 1)}
    for (seq, tp), g in groups.items():
        fit = {r["a2a"]: r["predicted_step_time_s"] for r in out["candidates"]
               if (r["seq"], r["tp"]) == (seq, tp) and r["fits_memory"]}
        assert g["a2a_sizes"] == band.close_group(fit, Band(width=out["band"]["width_log"]))
        assert g["a2a_sizes"][0] == min(fit, key=fit.get)  # the predicted best leads
        assert g["confident"] == (len(g["a2a_sizes"]) == 1)
        assert (g["settle_command"] is None) == g["confident"]
        marked = [r["a2a"] for r in out["candidates"]
                  if (r["seq"], r["tp"]) == (seq, tp) and r["too_close_to_call"]]
        assert sorted(marked) == ([] if g["confident"] else sorted(g["a2a_sizes"]))


@pytest.mark.parametrize("args,gap", [
    (["cluster=dgx-h200", "model=llama3-8b", "cp=8", "seq=65536", "tp=1", "pp=1"],
     "H200-SXM-141GB"),
    (["cluster=dgx-h100", "cp=16", "tp=4", "seq=131072"], "cross-node keys"),
    (["cluster=local", "model=tiny", "cp=4", "seq=8192", "tp=1", "pp=1"], "CPU profiles"),
    (["cluster=dgx-a100", "model=llama3-8b", "cp=4", "seq=16384", "tp=1", "pp=2"],
     "training steps"),
])
def test_outside_the_bands_domain_there_is_no_confident_pick(args, gap):
    """Issue 28: the band was checked on 8x A100 NVLink, one node, attention only."""
    out = predict.predict_rows(config.load(args))
    assert out["close_groups"]
    for g in out["close_groups"]:
        fit = sorted(r["a2a"] for r in out["candidates"]
                     if (r["seq"], r["tp"]) == (g["seq"], g["tp"]) and r["fits_memory"])
        assert not g["confident"] and gap in g["not_validated"]
        assert sorted(g["a2a_sizes"]) == fit and g["settle_command"]


def _planned(command: str) -> dict[tuple[int, int], list[int]]:
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "hcp_tune", "sweep"]
    cfg = config.load(words[4:])
    assert cfg.runner.name == "attention"  # a runner that measures
    kept: dict[tuple[int, int], list[int]] = {}
    for c in plan.candidates(cfg):
        if c.kept:
            kept.setdefault((c.seq, c.tp), []).append(c.layout.a2a)
    return kept


@pytest.mark.parametrize("width", [math.log(1.02), math.log(1.3), math.log(3.0)])
def test_the_printed_sweep_plans_exactly_the_group(width):
    cfg = config.load(CFG + ["env_tag=te-2.9", "mbs=2"])
    rows = predict.predict_rows(cfg)["candidates"]
    for g in predict.close_groups(cfg, rows, Band(width=width)):
        if g["confident"]:
            continue
        assert _planned(g["settle_command"]) == {(g["seq"], g["tp"]): sorted(g["a2a_sizes"])}
        assert "env_tag=te-2.9" in g["settle_command"] and "mbs=2" in g["settle_command"]


def test_the_widest_band_groups_every_fitting_layout_and_the_narrowest_none():
    cfg = config.load(CFG)
    rows = predict.predict_rows(cfg)["candidates"]
    wide = predict.close_groups(cfg, rows, Band(width=10.0))
    assert all(len(g["a2a_sizes"]) == 4 for g in wide)
    assert all(g["confident"] for g in predict.close_groups(cfg, rows, Band(width=0.0)))


def test_search_a2a_sizes_keeps_only_the_listed_layouts_and_says_why():
    cfg = config.load(CFG[:3] + ["seq=131072", "tp=1", "pp=1", "search.a2a_sizes=[2,8]"])
    cands = plan.candidates(cfg)
    assert sorted(c.layout.a2a for c in cands if c.kept) == [2, 8]
    assert {c.layout.a2a: c.reasons for c in cands if not c.kept} == {
        1: ("a2a=1 is not in search.a2a_sizes=[2,8]",),
        4: ("a2a=4 is not in search.a2a_sizes=[2,8]",)}


@pytest.mark.parametrize("value, message", [
    ("[3]", "search.a2a_sizes=[3]: 3 does not divide cp=8; expected a list of divisors of "
            "cp: 1, 2, 4, 8"),
    ("[0]", "search.a2a_sizes=[0]: element 0 is not an integer in 1..1024"),
])
def test_search_a2a_sizes_refuses_what_is_not_a_divisor_of_cp(value, message):
    with pytest.raises(config.ConfigError) as e:
        config.load(["cp=8", f"search.a2a_sizes={value}"])
    assert str(e.value) == message


def _calibration(tmp_path, n_keys: int):
    from hcp_tune.costmodel.calibrate import FitReport, save_params
    from hcp_tune.costmodel.formulas import CostParams

    per_row = [{"tp": 1, "cp": 8, "seq": 1024 * (s + 1), "measured_s": m, "predicted_s": p}
               for s in range(n_keys) for m, p in ((1.0, 1.0), (1.1, 1.2))]
    rep = FitReport(n=len(per_row), rms_rel_error=0.1, max_rel_error=0.1, per_row=per_row)
    save_params(tmp_path, "dgx-a100", "mine", CostParams(source="calibrated test"), rep)
    return config.load(CFG + [f"results_dir={tmp_path}", "env_tag=mine"])


def test_a_calibration_with_enough_keys_brings_its_own_band(tmp_path):
    cfg = _calibration(tmp_path, band.MIN_KEYS)
    out = predict.predict_rows(cfg)
    assert out["params_source"] == "calibrated test"
    assert out["band"]["width_log"] == pytest.approx(math.log(1.2 / 1.1))
    assert out["band"]["source"].startswith("this calibration's band on 10 measured keys")


def test_a_calibration_with_few_keys_uses_the_shipped_band_and_says_so(tmp_path):
    cfg = _calibration(tmp_path, 3)
    out = predict.predict_rows(cfg)
    assert out["band"]["width_log"] == band.shipped(cfg.cluster).width
    assert out["band"]["source"].endswith(
        f"the calibration has fewer than {band.MIN_KEYS} keys for a band of its own")


def test_predict_rows_say_which_level_crosses_nodes():
    out = predict.predict_rows(config.load(
        ["cluster=dgx-h200", "model=llama3-8b", "cp=16", "seq=131072", "tp=1", "pp=1"]))
    assert {(r["a2a"], r["crosses_nodes"]) for r in out["candidates"]} == {
        (1, "p2p"), (2, "p2p"), (4, "p2p"), (8, "p2p")}  # 8 GPUs a node: the ring leaves it
    cfg = config.load(["cluster=dgx-h200", "model=llama2-7b", "cp=8", "seq=131072", "tp=2",
                       "pp=1"])  # 32 KV heads: a2a=8 is kept, and tp*a2a = 16 > 8 GPUs a node
    got = {r["a2a"]: r["crosses_nodes"] for r in predict.predict_rows(cfg)["candidates"]}
    assert "a2a" in got[8].split("+")
    assert got == {c.layout.a2a: plan.row(c)["crosses_nodes"]  # as plan says
                   for c in plan.candidates(cfg) if c.kept}


def test_a_profile_may_name_a_shipped_calibration_and_your_own_wins(tmp_path):
    import dataclasses

    from hcp_tune.costmodel import calibrate

    names = calibrate.shipped_names()
    assert "a100-nvlink-published" in names
    cfg = config.load(CFG + [f"results_dir={tmp_path}", "env_tag=mine"])
    named = dataclasses.replace(cfg, cluster=dataclasses.replace(
        cfg.cluster, calibration="a100-nvlink-published"))
    params = predict.params_for(named)
    assert params.calibrated and "shipped as a100-nvlink-published" in params.source
    b = predict.band_for(named, params)
    assert b.source.startswith("held-out band of the shipped calibration a100-nvlink-published")
    assert predict.params_for(cfg).source == "uncalibrated defaults"  # no profile names one
    own = _calibration(tmp_path, 3)  # a calibration of your own, stored: it wins
    mine = dataclasses.replace(own, cluster=dataclasses.replace(
        own.cluster, calibration="a100-nvlink-published"))
    assert predict.params_for(mine).source == "calibrated test"


def test_an_unknown_shipped_calibration_is_one_line_naming_the_choices():
    import dataclasses

    from hcp_tune.costmodel import calibrate

    cfg = config.load(CFG)
    bad = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, calibration="nope"))
    with pytest.raises(config.ConfigError) as e:
        predict.params_for(bad)
    assert str(e.value) == ("cluster.calibration='nope': no calibration of that name ships with "
                            "hcp-tune; expected null or one of: "
                            + ", ".join(calibrate.shipped_names()))


def test_cli_refuses_an_unknown_shipped_calibration_in_one_line_exit_2():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "hcp_tune", "predict", *CFG,
                        "cluster.calibration=nope"], capture_output=True, text=True, cwd=repo,
                       timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "hcp-tune: error: cluster.calibration='nope': no calibration of that name ships with "
        "hcp-tune; expected null or one of: " + ", ".join(
            __import__("hcp_tune.costmodel.calibrate", fromlist=["x"]).shipped_names())]
