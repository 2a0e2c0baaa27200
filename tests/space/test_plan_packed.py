"""``plan`` with ``data.packing=thd``: the mix's summary per seq above the table, and the
packed-sequence rules on every layout (the same finding ``validate`` gives a Bridge config)."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from hcp_tune import config
from hcp_tune.packing import summarise
from hcp_tune.space import plan
from hcp_tune.space.layout import enumerate_layouts
from helpers import load_cluster, load_model

REPO = Path(__file__).resolve().parents[2]
PACKED = ["cp=4", "seq=8192", "data.packing=thd", "data.lengths=web", "model=tiny",
          "cluster=local"]
# 12 heads at tp=4: 3 per rank; a2a 3 divides them, but 3 is odd
ODD_MODEL = ("layers: 2\nhidden: 96\nffn_hidden: 256\nheads: 12\nkv_heads: 12\nhead_dim: 8\n"
             "vocab: 1024\n")


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})})


def test_notes_carry_the_mix_label_and_summary_per_seq():
    cfg = config.load([*PACKED[:1], "seq=[8192,16384]", *PACKED[2:]])
    notes = plan.notes(cfg)
    for seq in (8192, 16384):
        mix = cfg.mix_at(seq)
        line = f"data.packing=thd, mix {mix.label} at seq={seq}: {summarise(mix, seq, 4).line()}"
        assert line in notes
    (padding,) = [n for n in notes if n.startswith("[thd-doc-padding]")]
    assert "2*cp = 8 tokens" in padding and "depends on the document lengths" in padding


def test_one_seq_gives_the_padding_overhead_of_its_mix():
    cfg = config.load(PACKED)
    s = summarise(cfg.mix_at(8192), 8192, 4)
    (padding,) = [n for n in plan.notes(cfg) if n.startswith("[thd-doc-padding]")]
    assert padding.endswith(f"this mix gains {s.padding_overhead:.2%} padding tokens")


def test_fixed_length_plan_has_no_mix_notes():
    cfg = config.load(["cp=4", "seq=8192", "model=tiny", "cluster=local"])
    assert not [n for n in plan.notes(cfg) if "mix" in n or "thd" in n]


def test_plan_prints_the_mix_summary():
    r = run("plan", *PACKED)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # rich wraps lines at the console's width
    assert "note: data.packing=thd, mix web#" in text and "at seq=8192:" in text
    assert "documents a sequence; attention work" in text and "2*cp padding +" in text
    assert "[thd-doc-padding]" in text
    rows = json.loads(run("plan", *PACKED, "format=json").stdout)
    assert any(n.startswith("data.packing=thd, mix web#") for n in rows["notes"])
    assert all(c["kept"] for c in rows["candidates"])  # the torch reference: no TE rule applies


def test_packed_odd_heads_under_a2a_are_rejected_with_the_rule_id():
    m, h100 = load_model("tiny"), load_cluster("dgx-h100")
    m = dataclasses.replace(m, heads=12, kv_heads=12, hidden=96)
    packed = {c.layout.a2a: c for c in enumerate_layouts(m, h100, cp=6, tp=4, seq=12288,
                                                        packed=True)}
    assert packed[1].kept  # p2p: no a2a, the heads are fine
    assert not packed[3].kept
    assert any(r.startswith("[thd-no-backend] odd per-TP-rank query heads/tp = 12/4 = 3")
               for r in packed[3].reasons)
    fixed = {c.layout.a2a: c for c in enumerate_layouts(m, h100, cp=6, tp=4, seq=12288)}
    assert [f.rule for f in fixed[3].findings if f.severity == "error"] == ["heads-even-a2a"]


def test_plan_and_validate_report_the_same_packed_rule(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "odd.yaml").write_text(ODD_MODEL)
    env = {"HCP_TUNE_CONFIG_PATH": str(tmp_path)}
    r = run("plan", "cp=6", "tp=4", "seq=12288", "data.packing=thd", "data.lengths=web",
            "model=odd", "cluster=dgx-h100", "format=json", env=env)
    assert r.returncode == 0, r.stderr
    rows = {c["a2a"]: c for c in json.loads(r.stdout)["candidates"]}
    assert not rows[3]["kept"] and rows[1]["kept"]
    (rejected,) = [f for f in rows[3]["findings"] if f["rule"] == "thd-no-backend"]
    # p2p and a2a+p2p rows say what TE's version decides (info: kept)
    assert [f["rule"] for f in rows[1]["findings"]] == ["thd-te-unknown"]
    bridge = ["model.context_parallel_size=6", "model.tensor_model_parallel_size=4",
              "model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[3,2]",
              "model.seq_length=12288", "dataset.enable_offline_packing=true"]
    val = run("validate", *bridge, "model=odd", "te_version=2.19.0", "format=json", env=env)
    assert val.returncode == 1, val.stderr
    (found,) = [f for f in json.loads(val.stdout)["findings"] if f["rule"] == "thd-no-backend"]
    assert found == rejected  # same id, text and fix
