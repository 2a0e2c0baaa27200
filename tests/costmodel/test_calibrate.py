"""Calibration: the fit recovers known parameters, reports its error, stores and reloads."""
import json

import pytest

from hcp_tune import config
from hcp_tune.costmodel import calibrate
from hcp_tune.costmodel import predict as predict_mod
from hcp_tune.costmodel.calibrate import fit, holdout_error, load_params, save_params
from hcp_tune.costmodel.formulas import CostParams, predict_attention_layer
from hcp_tune.space.layout import Candidate, Layout, rank_groups

LOCAL = config.load(["cluster=local", "model=tiny"])
TRUE = CostParams(compute_efficiency=0.12, intra_bw_efficiency=0.3, latency_multiplier=40.0,
                  layer_overhead_us=3000.0)
TINY_DIMS = {"heads": 8, "kv_heads": 8, "head_dim": 8, "hidden": 64}


def synthetic_rows(seqs=(512, 1024, 2048, 4096), params=TRUE, noise=None):
    rows = []
    for cp in (4, 8):
        for a in [d for d in range(1, cp + 1) if cp % d == 0]:
            for i, seq in enumerate(seqs):
                layout = Layout(a, cp // a)
                groups = rank_groups(layout, tp=1, dp=1, gpus_per_node=8)
                c = Candidate(layout, 1, seq, 1, True, groups=groups)
                t = predict_attention_layer(LOCAL.model, LOCAL.cluster, c, dtype="fp32",
                                            params=params).step_time_s
                if noise:
                    t *= 1 + noise * (-1) ** (i + a)
                rows.append({"cluster": "local", "env_tag": "cpu", "model": "tiny", **TINY_DIMS,
                             "tp": 1, "cp": cp, "a2a": a, "p2p": cp // a, "seq": seq, "mbs": 1,
                             "dtype": "fp32", "runner": "attention", "median_s": t})
    return rows


def test_fit_reproduces_rows_made_by_known_parameters():
    rows = synthetic_rows()
    params, rep = fit(rows, clusters={"local": LOCAL.cluster})
    assert rep.n == len(rows) == 28
    assert rep.rms_rel_error < 0.01 and rep.max_rel_error < 0.03
    assert "inter_bw_efficiency" not in rep.fitted  # no row crosses nodes: left alone
    assert params.inter_bw_efficiency == CostParams().inter_bw_efficiency
    assert params.source.startswith("calibrated ") and "local/cpu on 28 rows" in params.source


def test_fit_report_rows_carry_measured_and_predicted_seconds():
    rows = synthetic_rows(noise=0.05)
    _, rep = fit(rows, clusters={"local": LOCAL.cluster})
    r = rep.per_row[0]
    assert set(r) == {"cp", "a2a", "p2p", "tp", "seq", "mix", "measured_s", "predicted_s",
                      "rel_error"}
    assert r["mix"] == ""  # a fixed-length row (packed rows carry their mix label)
    assert r["rel_error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    assert 0.02 < rep.rms_rel_error < 0.08  # the 5% noise cannot be fitted away


def test_holdout_predicts_unmeasured_sequence_lengths():
    rows = synthetic_rows()
    params, train, test = holdout_error(rows, [512, 1024, 4096], [2048],
                                        clusters={"local": LOCAL.cluster})
    assert train.n == 21 and test.n == 7
    assert {r["seq"] for r in test.per_row} == {2048}
    assert test.rms_rel_error < 0.02


def test_holdout_needs_rows_on_both_sides():
    with pytest.raises(ValueError, match="holdout needs rows in both"):
        holdout_error(synthetic_rows(), [512], [999], clusters={"local": LOCAL.cluster})


def test_fit_refuses_mixed_clusters_or_tags():
    rows = synthetic_rows()
    rows[0] = {**rows[0], "env_tag": "other"}
    with pytest.raises(ValueError, match="one cluster and environment tag at a time"):
        fit(rows, clusters={"local": LOCAL.cluster})


def test_fit_refuses_no_measurements():
    with pytest.raises(ValueError, match="at least one measured row"):
        fit([{**synthetic_rows()[0], "median_s": None}])


def test_rows_by_model_name_load_profiles_from_conf():
    rows = [{k: v for k, v in r.items() if k not in TINY_DIMS} for r in synthetic_rows()]
    _, rep = fit(rows)  # cluster=local, model=tiny read from conf/
    assert rep.rms_rel_error < 0.01


def test_params_stored_beside_results_and_reloaded(tmp_path):
    params, rep = fit(synthetic_rows(), clusters={"local": LOCAL.cluster})
    path = save_params(tmp_path, "local", "cpu", params, rep)
    assert path == tmp_path / "calibration" / "local__cpu.json"
    doc = json.loads(path.read_text())
    assert doc["fit"]["n"] == 28 and "per_row" not in doc["fit"]
    assert load_params(tmp_path, "local", "cpu") == params
    assert load_params(tmp_path, "local", "other-tag") is None


def test_later_predictions_use_the_calibration(tmp_path):
    params, rep = fit(synthetic_rows(), clusters={"local": LOCAL.cluster})
    save_params(tmp_path, "local", "cpu", params, rep)
    cfg = config.load(["cluster=local", "model=tiny", "cp=4", "seq=2048", "dtype=fp32",
                       f"results_dir={tmp_path}", "env_tag=cpu"])
    out = predict_mod.predict_rows(cfg)
    assert out["label"].startswith("predicted (calibrated ")
    assert all(r["label"] == out["label"] for r in out["candidates"])


def test_main_writes_params_and_reports_error(tmp_path, capsys):
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text("\n".join(json.dumps(r) for r in synthetic_rows()))
    assert calibrate.main([str(rows_file), f"results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "on 28 rows: rms relative error" in out
    assert (tmp_path / "calibration" / "local__cpu.json").is_file()


def test_a_stored_tag_that_is_no_name_stays_inside_the_calibration_folder():
    from hcp_tune.costmodel.calibrate import params_path

    assert params_path("r", "local", "te-2.10").name == "local__te-2.10.json"
    for tag in ("a/b", "../../x"):
        path = params_path("r", "local", tag)
        assert path.parent.as_posix() == "r/calibration" and "/" not in path.name
    assert params_path("r", "local", "a/b") != params_path("r", "local", "a_b")
