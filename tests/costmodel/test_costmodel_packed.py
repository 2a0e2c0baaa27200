"""The cost model on packed keys (hcp_tune/costmodel/packed.py): the documents' sum(d^2)
work instead of S^2, the per-rank balance of the 2*CP chunks, unchanged transfers, and
predictions that say they are not validated on packed data until a calibration fitted on
packed rows is in use."""
import dataclasses
import json

import pytest
from helpers import cand

from hcp_tune import config
from hcp_tune.costmodel import predict as predict_mod
from hcp_tune.costmodel.attention import block_efficiency
from hcp_tune.costmodel.calibrate import params_path, predict_row
from hcp_tune.costmodel.formulas import CostParams, predict, predict_attention_layer
from hcp_tune.costmodel.packed import NOT_VALIDATED, chunk_work, mix_of_row, packed_work
from hcp_tune.packing import LengthMix, padded, preset

H100 = config.load(["cluster=dgx-h100", "model=llama3-8b", "tp=1", "pp=1"])
SEQ = 32768


def one_length(d: int) -> LengthMix:
    return LengthMix(f"only{d}", ((d, 1),))


def test_a_padded_document_splits_evenly_and_tail_padding_unloads_position_0():
    cp = 4
    even = chunk_work(8 * 100, cp)  # a multiple of 2*cp: no padding
    assert len(set(even)) == 1 and sum(even) == 800 * 801 // 2
    tail = chunk_work(8 * 100 - 7, cp)  # 7 padding tokens in chunk 2*cp-1, held by position 0
    assert tail[0] < min(tail[1:]) and sum(tail) == 793 * 794 // 2


def test_one_document_filling_the_sequence_predicts_exactly_the_fixed_length_key():
    work = packed_work(one_length(SEQ), SEQ, 8, 2)
    assert work.work_fraction == 1.0 and work.imbalance == 1.0 and work.docs_per_seq == 1
    c = cand(2, 4, seq=SEQ)
    fixed = predict(H100.model, H100.cluster, c)
    packed = predict(H100.model, H100.cluster, c, packed=work)
    assert packed.step_time_s == pytest.approx(fixed.step_time_s, rel=1e-12)
    assert packed.terms.compute_imbalance_s == pytest.approx(0.0, abs=1e-15)


def test_short_documents_shrink_compute_keep_the_all_to_all_and_expose_more_ring():
    c = cand(2, 4, seq=SEQ)
    work = packed_work(one_length(4096), SEQ, 8, 2)  # 8 documents of S/8
    assert work.work_fraction == pytest.approx(8 * 4096**2 / SEQ**2)  # 1/8 of S^2
    fixed = predict_attention_layer(H100.model, H100.cluster, c)
    packed = predict_attention_layer(H100.model, H100.cluster, c, packed=work)
    # sum(d^2) is 1/8 of S^2, each document's ring-step kernel 4096/4 tokens instead of
    # SEQ/4 (less efficient) and the documents fill the sequence evenly (no imbalance)
    eff = block_efficiency(SEQ / 4, CostParams()) / block_efficiency(4096 / 4, CostParams())
    assert eff > 1.2 and work.imbalance == 1.0
    assert packed.compute_s == pytest.approx(fixed.compute_s / 8 * eff, rel=1e-12)
    assert packed.exposed_a2a_s == pytest.approx(fixed.exposed_a2a_s)  # volume per token
    assert packed.terms.a2a_volume_s == pytest.approx(fixed.terms.a2a_volume_s)
    # on PCIe links, short documents: a ring step's compute no longer hides its (unchanged)
    # K/V block
    pcie = config.load(["cluster=pcie-a100", "model=llama3-8b", "tp=1", "pp=1"])
    ring = cand(1, 8, seq=SEQ)
    short = packed_work(one_length(1024), SEQ, 8, 1)
    fixed = predict_attention_layer(pcie.model, pcie.cluster, ring)
    packed = predict_attention_layer(pcie.model, pcie.cluster, ring, packed=short)
    assert packed.exposed_p2p_s > 1.2 * fixed.exposed_p2p_s
    assert packed.terms.ring_transfer_s > 2 * fixed.terms.ring_transfer_s  # not only hand-back


def test_per_rank_balance_follows_the_chunks_and_the_a2a_groups():
    mix = one_length(2 * 8 * 64 + 1)  # each document padded by 15 tokens at its end
    p2p = packed_work(mix, 8192, 8, 1)  # every CP position on its own
    a2a = packed_work(mix, 8192, 8, 8)  # one group holds the whole sequence: balanced
    assert p2p.imbalance > 1.0 and a2a.imbalance == 1.0
    c = cand(1, 8, seq=8192)
    pred = predict_attention_layer(H100.model, H100.cluster, c, packed=p2p)
    t = pred.terms
    assert t.compute_imbalance_s > 0
    assert pred.compute_s == pytest.approx(t.compute_ideal_s + t.compute_short_block_s
                                           + t.compute_few_heads_s + t.compute_imbalance_s)
    assert p2p.padding_overhead == pytest.approx(15 / 1025)
    assert all(dp == padded(d, 8) for d, dp in p2p.docs)


def _packed_cfg(tmp_path, *extra):
    return config.load(["cluster=dgx-h200", "model=llama3-8b", "tp=1", "pp=1", "cp=8",
                        f"seq={SEQ}", "data.packing=thd", "data.lengths=web",
                        f"results_dir={tmp_path}", *extra])


def test_packed_keys_are_labelled_not_validated_and_never_a_confident_pick(tmp_path):
    cfg = _packed_cfg(tmp_path)
    out = predict_mod.predict_rows(cfg)
    rows = out["candidates"]
    assert rows and all(r["packed"]["mix"] == cfg.mix_at(SEQ).label for r in rows)
    assert all(r["packed"]["validated"] is False and r["packed"]["note"] == NOT_VALIDATED
               for r in rows)
    assert all(r["label"].endswith(f"packed {cfg.mix_at(SEQ).label}: {NOT_VALIDATED}")
               for r in rows)
    group, = out["close_groups"]
    assert not group["confident"] and "packed data (mix web#" in group["not_validated"]
    assert "data.packing=thd data.lengths=web" in group["settle_command"]
    # the same key at fixed length carries no packed figures
    fixed = predict_mod.predict_rows(config.load(
        ["cluster=dgx-h200", "model=llama3-8b", "tp=1", "pp=1", "cp=8", f"seq={SEQ}"]))
    assert not any("packed" in r for r in fixed["candidates"])


def test_a_calibration_fitted_on_packed_rows_lifts_the_label(tmp_path):
    cfg = _packed_cfg(tmp_path)
    path = params_path(tmp_path, cfg.cluster.name, cfg.env_tag)
    path.parent.mkdir(parents=True)
    params = CostParams(source="calibrated 2026-12-01 dgx-h200/default on 12 rows")
    for packed_rows, expected in ((0, False), (12, True)):
        path.write_text(json.dumps({"params": params.as_dict(),
                                    "fit": {"packed_rows": packed_rows}}))
        rows = predict_mod.predict_rows(cfg)["candidates"]
        assert all(r["packed"]["validated"] is expected for r in rows)
        assert all((NOT_VALIDATED in r["label"]) is not expected for r in rows)


def test_the_sweep_order_uses_the_packed_prediction(tmp_path):
    cfg = _packed_cfg(tmp_path)
    fixed_cfg = dataclasses.replace(cfg, mixes=())
    packed = {c.layout.a2a: p.compute_s for c, p in predict_mod.ordering(cfg)}
    fixed = {c.layout.a2a: p.compute_s for c, p in predict_mod.ordering(fixed_cfg)}
    assert packed.keys() == fixed.keys() and all(packed[a] < fixed[a] for a in packed)


def test_a_packed_row_is_calibrated_on_its_own_documents():
    c = cand(2, 4, seq=8192)
    row = {"seq": 8192, "mix": preset("web").cut(8192).label, "runner": "attention"}
    work = packed_work(preset("web").cut(8192), 8192, 8, 2)
    got = predict_row(H100.model, H100.cluster, c, row, CostParams())
    want = predict_attention_layer(H100.model, H100.cluster, c, packed=work)
    assert got.step_time_s == want.step_time_s
    assert mix_of_row({"seq": 8192, "mix": ""}) is None


@pytest.mark.parametrize("row,message", [
    ({"seq": 8192, "mix": "corpus.csv#abcdef"}, "row mix='corpus.csv#abcdef': data.lengths="),
    ({"seq": 8192, "mix": "web#000000"}, "the rebuilt mix hashes to"),
])
def test_a_packed_row_whose_mix_cannot_be_rebuilt_is_named(row, message):
    with pytest.raises(ValueError, match=message):
        mix_of_row(row)


def test_predict_prints_the_mix_and_says_not_validated(capsys, monkeypatch, tmp_path):
    from hcp_tune.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    assert main(["predict", "cp=4", "seq=8192", "model=tiny", "cluster=local",
                 "data.packing=thd", "data.lengths=web", f"results_dir={tmp_path}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    label = preset("web").cut(8192).label
    assert f"packed tp=1 seq=8192 mix {label}, the 1 sequence(s) a trial runs:" in out
    assert f"predictions are {NOT_VALIDATED}" in out
    assert "data.packing=thd data.lengths=web" in out.split("measure them all")[1]  # settle
