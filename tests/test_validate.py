"""Every validate rule on a good and a bad config; findings carry the exact fix."""
import pytest

from hcp_tune.cluster import ClusterProfile
from hcp_tune.errors import ConfigError, InputFileError
from hcp_tune.model import ModelSpec
from hcp_tune.validate import apply_overrides, check, read_config_file, suggest_sizes

H100 = ClusterProfile(
    name="dgx-h100", device="cuda", gpu_name="x", gpus_per_node=8, intra_node_bw_gbs=450,
    inter_node_bw_gbs=50, peak_bf16_tflops=989, gpu_memory_gib=80,
)
LLAMA8B = ModelSpec(name="llama3-8b", layers=32, hidden=4096, ffn_hidden=14336, heads=32,
                    kv_heads=8, head_dim=128, vocab=128256)

GOOD = [
    "model.context_parallel_size=8",
    "model.cp_comm_type=a2a+p2p",
    "model.hierarchical_context_parallel_sizes=[2,4]",
    "model.seq_length=131072",
    "model.num_attention_heads=32",
    "model.num_query_groups=8",
]


def findings(*extra, base=GOOD, **kw):
    kw.setdefault("te_version", "2.9.0")
    return check(apply_overrides({}, [*base, *extra]), **kw)


def rules(fs, severity=None):
    return [f.rule for f in fs if severity is None or f.severity == severity]


def test_good_config_is_clean():
    assert findings(cluster=H100) == []


def test_sizes_product_shows_the_arithmetic_and_fix():
    (f,) = findings("model.hierarchical_context_parallel_sizes=[2,2]")
    assert f.rule == "sizes-product" and f.severity == "error"
    assert "a2a(2) * p2p(2) = 4 != context_parallel_size(8)" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[8,1]"' or "[4,2]" in f.fix


def test_fix_prefers_an_a2a_level_inside_a_node():
    (f,) = findings("model.hierarchical_context_parallel_sizes=[2,2]", cluster=H100)
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_three_levels_rejected():
    fs = findings("model.hierarchical_context_parallel_sizes=[2,2,2]")
    assert rules(fs) == ["two-levels"]
    assert "3 levels" in fs[0].found


def test_seq_not_divisible_by_two_cp():
    (f,) = findings("model.seq_length=131000")
    assert f.rule == "seq-divisible"
    assert "131000 is not divisible by 2*cp = 16" in f.found
    assert f.fix == "model.seq_length=131008 (or 130992)"


def test_silent_cp_off_is_explained():
    fs = findings("model.hierarchical_context_parallel_sizes=null", cluster=H100)
    (f,) = fs
    assert f.rule == "silent-cp-off" and f.severity == "error"
    assert "TE computes cp_size=1" in f.found and "1/8 of the sequence" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_sizes_without_a2a_p2p_do_nothing_warning():
    (f,) = findings("model.cp_comm_type=p2p")
    assert f.rule == "sizes-ignored" and f.severity == "warning"
    assert "do nothing" in f.found


@pytest.mark.parametrize("sizes,bad", [("[8,1]", False), ("[4,2]", False)])
def test_heads_a2a_good_at_tp1(sizes, bad):
    fs = findings(f"model.hierarchical_context_parallel_sizes={sizes}")
    assert ("heads-a2a" in rules(fs)) == bad


def test_kv_heads_not_divisible_by_a2a_at_tp2():
    fs = findings("model.tensor_model_parallel_size=2",
                  "model.hierarchical_context_parallel_sizes=[8,1]")
    (f,) = [f for f in fs if f.rule == "heads-a2a"]
    assert "num_query_groups/tp = 8/2 = 4" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_query_heads_rule_uses_model_spec_when_config_has_none():
    base = [g for g in GOOD if "num_" not in g]
    fs = findings("model.context_parallel_size=16", "model.seq_length=131072",
                  "model.hierarchical_context_parallel_sizes=[16,1]", base=base,
                  model=LLAMA8B)
    assert "heads-a2a" in rules(fs)
    assert findings(base=base, model=LLAMA8B) == []


def test_unknown_heads_are_reported_not_guessed():
    base = [g for g in GOOD if "num_" not in g]
    fs = findings(base=base)
    assert rules(fs) == ["heads-unknown"] and fs[0].severity == "info"


def test_pure_a2a_needs_heads_divisible_by_cp():
    fs = findings("model.cp_comm_type=a2a", "model.hierarchical_context_parallel_sizes=null",
                  "model.context_parallel_size=16", "model.seq_length=131072")
    assert "heads-a2a" in rules(fs)
    assert findings("model.cp_comm_type=a2a", "model.hierarchical_context_parallel_sizes=null") == []


def test_tp_not_dividing_heads():
    fs = findings("model.tensor_model_parallel_size=3")
    f = next(f for f in fs if f.rule == "heads-tp")
    assert f.fix == "model.tensor_model_parallel_size=2"


def test_decentralized_pg_must_be_false():
    (f,) = findings("dist.use_decentralized_pg=true")
    assert f.rule == "decentralized-pg" and f.fix == "dist.use_decentralized_pg=false"
    assert findings("dist.use_decentralized_pg=false") == []


@pytest.mark.parametrize("te,bad", [("1.11.0", True), ("1.12.0", False), ("2.9.0+abc", False)])
def test_te_minimum_version(te, bad):
    assert ("te-version" in rules(findings(te_version=te), "error")) == bad


def test_te_version_unknown_is_info(monkeypatch):
    monkeypatch.setattr("hcp_tune.validate.installed_te_version", lambda: None)
    fs = check(apply_overrides({}, GOOD), te_version=None)
    assert rules(fs) == ["te-version"] and fs[0].severity == "info"


@pytest.mark.parametrize("te,bad", [("2.18.1", True), ("2.19.0", False)])
def test_packed_sequences_need_te_after_2_18(te, bad):
    fs = findings("model.qkv_format=thd", te_version=te)
    assert ("te-thd" in rules(fs)) == bad
    fs = findings("dataset.packed_sequence_specs.packed_sequence_size=8192", te_version=te)
    assert ("te-thd" in rules(fs)) == bad


@pytest.mark.parametrize(
    "override,text",
    [
        ("model.window_size=[128,0]", "sliding-window"),
        ("model.softmax_type=off-by-one", "vanilla softmax"),
        ("model.position_embedding_type=relative", "attention bias"),
    ],
)
def test_unsupported_attention_features(override, text):
    (f,) = findings(override)
    assert f.rule == "attention-features" and text in f.found
    assert findings(override, "model.cp_comm_type=p2p",
                    "model.hierarchical_context_parallel_sizes=null") == []


def test_a2a_crossing_nodes_warns_on_the_cluster():
    fs = findings("model.context_parallel_size=16", "model.seq_length=131072",
                  "model.num_attention_heads=64", "model.num_query_groups=16",
                  "model.hierarchical_context_parallel_sizes=[16,1]", cluster=H100)
    (f,) = fs
    assert f.rule == "a2a-cross-node" and "tp*a2a = 1*16 = 16 > 8" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[8,2]"'


def test_suggest_sizes_falls_back_to_none_when_nothing_fits():
    assert suggest_sizes(8, 1, 1, 1, 8) is None
    assert suggest_sizes(8, 1, 32, 8, 8) == [4, 2]


def test_bad_comm_type_is_input_error():
    with pytest.raises(ConfigError, match="model.cp_comm_type='ring': expected one of"):
        findings("model.cp_comm_type=ring")


def test_bad_cp_value_is_input_error():
    with pytest.raises(ConfigError, match=r"model.context_parallel_size='abc': expected an integer"):
        findings("model.context_parallel_size=abc")


def test_config_file_errors(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        read_config_file(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputFileError, match="expected a mapping .* got list"):
        read_config_file(str(tmp_path / "list.yaml"))
    (tmp_path / "broken.yaml").write_text("model: [1, 2\n")
    with pytest.raises(InputFileError, match="not valid YAML at line"):
        read_config_file(str(tmp_path / "broken.yaml"))
