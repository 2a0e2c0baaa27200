"""``validate`` on a Bridge config with packed sequences: the dataset fields Bridge 0.6 packs
with (read at Megatron-Bridge r0.6.0: ``data/builders/gpt_sft.py`` GPTSFTDatasetConfig,
``data/packing/config.py`` PackedSequenceSpecs, ``scripts/training/recipe_runner.py``
``sync_offline_packing_alignment``), and the rule each TE release gets, through the CLI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hcp_tune.errors import ConfigError
from hcp_tune.space.validate import apply_overrides, check, facts

REPO = Path(__file__).resolve().parents[2]
DRY_RUN = REPO / "tests" / "data" / "bridge_dry_run.yaml"
SPECS = {"_target_": "megatron.bridge.data.packing.config.PackedSequenceSpecs",
         "packed_sequence_size": 131072, "pad_seq_to_mult": 16, "pad_cu_seqlens": False,
         "max_single_sequence_length": None, "packed_train_data_path": None}


def packed_dry_run(tmp_path: Path, **model) -> Path:
    """run_recipe.py --dry-run output of an SFT run with offline packing on: specs resolved
    (pad_seq_to_mult raised to 2*cp = 16 by sync_offline_packing_alignment)."""
    tree = yaml.safe_load(DRY_RUN.read_text())
    tree["dataset"].update(enable_offline_packing=True, offline_packing_specs=dict(SPECS))
    tree["model"].update(model)
    path = tmp_path / "ConfigContainer.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def run(*args):
    return subprocess.run([sys.executable, "-m", "hcp_tune", "validate", *args, "format=json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ})


def by_rule(r) -> dict[str, dict]:
    return {f["rule"]: f for f in json.loads(r.stdout)["findings"]}


P2P = {"cp_comm_type": "p2p", "hierarchical_context_parallel_sizes": None}
# (comm type, TE release) -> exit code, errors, infos, for the packed config at cp=8
BY_TE = [
    ("a2a+p2p", "2.17.1", 1, {"te-thd", "thd-pad-detect"}, {"thd-doc-padding"}),
    ("a2a+p2p", "2.18.0", 1, {"te-thd"}, {"thd-padded-identity", "thd-doc-padding"}),
    ("a2a+p2p", "2.19.0", 0, set(), {"thd-padded-identity", "thd-doc-padding"}),
    ("p2p", "2.17.1", 1, {"thd-pad-detect"}, {"thd-doc-padding"}),
    ("p2p", "2.18.0", 0, set(), {"thd-padded-identity", "thd-doc-padding"}),
    ("p2p", "2.19.0", 0, set(), {"thd-padded-identity", "thd-doc-padding"}),
]


@pytest.mark.parametrize("comm,te,code,errors,infos", BY_TE, ids=[f"{c[0]}-{c[1]}" for c in BY_TE])
def test_packed_config_gets_the_rule_of_its_te(tmp_path, comm, te, code, errors, infos):
    cfg = packed_dry_run(tmp_path, **(P2P if comm == "p2p" else {}))
    r = run(str(cfg), f"te_version={te}")
    assert r.returncode == code, r.stdout + r.stderr
    found = by_rule(r)
    assert {k for k, f in found.items() if f["severity"] == "error"} == errors
    assert {k for k, f in found.items() if f["severity"] == "info"} == infos


def test_pad_between_seqs_from_the_forward_step_clears_the_2_17_refusal(tmp_path):
    cfg = str(packed_dry_run(tmp_path, **P2P))
    r = run(cfg, "te_version=2.17.1", "pad_between_seqs=true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(by_rule(r)) == {"thd-doc-padding"}
    r = run(cfg, "te_version=2.19.0", "pad_between_seqs=false")
    assert r.returncode == 1 and "thd-pad-detect" in by_rule(r)


def test_a_bad_pad_between_seqs_is_one_line_exit_2(tmp_path):
    r = run(str(packed_dry_run(tmp_path)), "te_version=2.19.0", "pad_between_seqs=maybe")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith("pad_between_seqs='maybe': expected true or false")
    assert len(r.stderr.strip().splitlines()) == 1


def test_fixed_length_config_gets_no_packed_rule(tmp_path):
    r = run(str(DRY_RUN), "te_version=2.17.1")
    assert r.returncode == 0 and by_rule(r) == {}


# ---------------------------------------------------------------- the dataset fields


def tree(*overrides):
    base = ["model.context_parallel_size=4", "model.cp_comm_type=p2p", "model.seq_length=8192",
            "model.num_attention_heads=32", "model.num_query_groups=8"]
    return apply_overrides({}, [*base, *overrides])


@pytest.mark.parametrize("overrides,packed", [
    (["dataset.enable_offline_packing=true"], True),
    (["dataset.enable_offline_packing=false"], False),
    (["dataset.enable_in_batch_packing=true"], True),  # DirectHFSFT / Energon datasets
    (["dataset.offline_packing_specs.packed_sequence_size=8192"], True),
    (["dataset.offline_packing_specs.packed_sequence_size=-1"], False),  # -1: no packing
    (["dataset.packed_sequence_specs.packed_sequence_size=8192"], True),  # Bridge <= 0.5
    (["model.qkv_format=thd"], True),  # hcp-tune's shorthand
    ([], False),
])
def test_packing_is_read_from_bridge_dataset_fields(overrides, packed):
    assert facts(tree(*overrides), te_version="2.19.0").packed == packed


@pytest.mark.parametrize("overrides,multiple", [
    # hand-written: run_recipe.py raises pad_seq_to_mult to lcm(it, 2*cp)
    (["dataset.enable_offline_packing=true"], 8),
    (["dataset.enable_offline_packing=true", "dataset.offline_packing_specs.pad_seq_to_mult=64"],
     64),
    (["dataset.enable_offline_packing=true", "dataset.offline_packing_specs.pad_seq_to_mult=12"],
     24),
    # sequence parallelism adds cp*tp (ConfigContainer.validate, recipe_runner.py)
    (["dataset.enable_in_batch_packing=true", "model.sequence_parallel=true",
      "model.tensor_model_parallel_size=4"], 16),
])
def test_padding_multiple_is_the_one_bridge_runs(overrides, multiple):
    assert facts(tree(*overrides), te_version="2.19.0").pad_multiple == multiple


def test_resolved_config_keeps_its_padding_multiple(tmp_path):
    tree_ = yaml.safe_load(packed_dry_run(tmp_path).read_text())
    tree_["dataset"]["offline_packing_specs"]["pad_seq_to_mult"] = 48
    assert facts(tree_, te_version="2.19.0").pad_multiple == 48
    (f,) = [f for f in check(tree_, te_version="2.19.0") if f.rule == "thd-doc-padding"]
    assert "2*cp = 16 tokens (here 48: pad_seq_to_mult)" in f.found


def test_wrongly_typed_packing_fields_are_input_errors():
    with pytest.raises(ConfigError, match="dataset.enable_offline_packing='yes please'"):
        facts(apply_overrides({}, ["dataset.enable_offline_packing=yes please"]))
    with pytest.raises(ConfigError, match="packed_sequence_size='big'"):
        facts(apply_overrides({}, ["dataset.offline_packing_specs.packed_sequence_size=big"]))
