"""Every validate rule both ways: a config where it fires and a neighbouring one where it
must not; findings carry the rule id and the exact fix."""
import copy
from pathlib import Path

import pytest
import yaml

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.errors import ConfigError, InputFileError
from hcp_tune.space.validate import apply_overrides, check, read_config_file, suggest_sizes
from hcp_tune.upstream.rules import RULES

DRY_RUN = Path(__file__).parents[1] / "data" / "bridge_dry_run.yaml"
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
NO_SIZES = "model.hierarchical_context_parallel_sizes=null"
# 12 heads at tp=4: 3 per rank; a2a 3 divides them, but 3 is odd (TE >= 2.15 has no backend)
ODD = ["model.num_attention_heads=12", "model.num_query_groups=12",
       "model.tensor_model_parallel_size=4", "model.context_parallel_size=6",
       "model.hierarchical_context_parallel_sizes=[3,2]", "model.seq_length=120000"]
FT = ["dataset.seq_length=131072", "dataset.enable_offline_packing=false"]
PACKED = "dataset.enable_offline_packing=true"  # Bridge 0.6 offline packing (THD)
P2P = ["model.cp_comm_type=p2p", NO_SIZES]


def findings(*extra, base=GOOD, **kw):
    kw.setdefault("te_version", "2.9.0")
    return check(apply_overrides({}, [*base, *extra]), **kw)


def rules(fs, severity=None):
    return [f.rule for f in fs if severity is None or f.severity == severity]


def only(rule, *extra, **kw):
    """The one finding of ``rule``; fails when it did not fire."""
    (f,) = [f for f in findings(*extra, **kw) if f.rule == rule]
    return f


def test_good_config_is_clean():
    assert findings(cluster=H100) == []


# (rule, overrides where it fires, the neighbouring overrides where it must not, kwargs)
BOTH_WAYS = [
    ("comm-type", ["model.cp_comm_type=allgather", NO_SIZES],
     ["model.cp_comm_type=all_gather", NO_SIZES], {}),
    ("comm-type", ["model.cp_comm_type=ring", NO_SIZES],
     ["model.cp_comm_type=ring", NO_SIZES, "model.context_parallel_size=1"], {}),
    ("comm-type-layers", ["model.num_layers=4", "model.cp_comm_type=[p2p,p2p,p2p]", NO_SIZES],
     ["model.num_layers=4", "model.cp_comm_type=[p2p,p2p,p2p,a2a]", NO_SIZES], {}),
    ("silent-cp-off", [NO_SIZES], [], {}),
    ("silent-cp-off", [NO_SIZES, "model.context_parallel_size=1"],
     [NO_SIZES, "model.context_parallel_size=1", "model.cp_comm_type=p2p"], {}),
    ("two-levels", ["model.hierarchical_context_parallel_sizes=[2,2,2]"], [], {}),
    ("sizes-product", ["model.hierarchical_context_parallel_sizes=[2,2]"], [], {}),
    ("sizes-product", ["model.cp_comm_type=p2p", "model.hierarchical_context_parallel_sizes=[2,2]"],
     ["model.cp_comm_type=p2p", NO_SIZES], {}),
    ("sizes-ignored", ["model.cp_comm_type=p2p"], ["model.cp_comm_type=p2p", NO_SIZES], {}),
    ("seq-divisible", ["model.seq_length=131000"], ["model.seq_length=131008"], {}),
    ("heads-tp", ["model.tensor_model_parallel_size=3"], ["model.tensor_model_parallel_size=2"], {}),
    ("heads-a2a", ["model.tensor_model_parallel_size=2", "model.hierarchical_context_parallel_sizes=[8,1]"],
     ["model.tensor_model_parallel_size=2", "model.hierarchical_context_parallel_sizes=[4,2]"], {}),
    ("heads-even-a2a", ODD, [*ODD, "model.tensor_model_parallel_size=2"], {"te_version": "2.17.1"}),
    ("heads-even-a2a", ODD, [*ODD, "model.cp_comm_type=p2p", NO_SIZES], {"te_version": "2.17.1"}),
    ("heads-even-a2a", ODD, ODD, {"te_version": "2.17.1", "te_old": "2.14.0"}),
    ("heads-even-a2a", ODD, [*ODD, "model.qkv_format=thd"], {"te_version": "2.19.0"}),
    ("a2a-cross-node", ["model.context_parallel_size=16", "model.num_attention_heads=64",
                        "model.num_query_groups=16", "model.hierarchical_context_parallel_sizes=[16,1]"],
     ["model.context_parallel_size=16", "model.num_attention_heads=64", "model.num_query_groups=16",
      "model.hierarchical_context_parallel_sizes=[8,2]"], {"cluster": H100}),
    ("decentralized-pg", ["dist.use_decentralized_pg=true"], ["dist.use_decentralized_pg=false"], {}),
    ("layers-pp", ["model.num_layers=32", "model.pipeline_model_parallel_size=3"],
     ["model.num_layers=32", "model.pipeline_model_parallel_size=4"], {}),
    ("pp-stage-placement", ["model.pipeline_model_parallel_size=2", "model.context_parallel_size=6",
                            "model.hierarchical_context_parallel_sizes=[2,3]",
                            "model.tensor_model_parallel_size=2", "model.seq_length=12288"],
     ["model.pipeline_model_parallel_size=2", "model.tensor_model_parallel_size=2"],
     {"cluster": H100}),
    ("te-version", [], [], {"te_version": "1.11.0", "te_old": "1.12.0"}),
    ("te-thd", ["model.qkv_format=thd"], ["model.qkv_format=thd"], {"te_version": "2.18.1", "te_old": "2.19.0"}),
    ("te-thd", ["dataset.offline_packing_specs.packed_sequence_size=8192"],
     ["dataset.offline_packing_specs.packed_sequence_size=-1"], {"te_version": "2.18.1"}),
    ("thd-pad-detect", [PACKED, *P2P], [PACKED, *P2P], {"te_version": "2.17.1", "te_old": "2.18.0"}),
    ("thd-pad-detect", [PACKED, *P2P], [PACKED, "model.cp_comm_type=a2a", NO_SIZES],
     {"te_version": "2.17.1"}),
    ("thd-padded-identity", [PACKED], [PACKED], {"te_version": "2.19.0", "te_old": "2.17.1"}),
    ("thd-no-backend", [*ODD, PACKED], ODD, {"te_version": "2.19.0"}),
    ("thd-no-backend", [*ODD, PACKED], [*ODD, PACKED, "model.tensor_model_parallel_size=2"],
     {"te_version": "2.19.0"}),
    ("thd-doc-padding", [PACKED], [], {}),
    ("thd-doc-padding", [PACKED], [PACKED, "model.context_parallel_size=1", *P2P], {}),
    ("sliding-window", ["model.window_size=[128,0]"], ["model.window_size=[128,0]",
                                                      "model.cp_comm_type=a2a", NO_SIZES], {}),
    ("sliding-window", ["model.window_size=[128,0]", "model.cp_comm_type=p2p", NO_SIZES],
     ["model.window_size=[128,0]", "model.cp_comm_type=all_gather", NO_SIZES], {}),
    ("sliding-window", ["model.window_size=[4096,0]"], ["model.window_size=[-1,0]"], {}),
    ("sliding-window", ["model.window_size=[4096,4096]"], ["model.window_size=[-1,-1]"], {}),
    ("softmax-type", ["model.softmax_type=off-by-one"],
     ["model.softmax_type=off-by-one", "model.cp_comm_type=a2a", NO_SIZES], {}),
    ("softmax-type", ["model.softmax_type=learnable", "model.cp_comm_type=all_gather", NO_SIZES],
     ["model.softmax_type=vanilla", "model.cp_comm_type=all_gather", NO_SIZES], {}),
    ("attention-bias", ["model.position_embedding_type=relative"],
     ["model.position_embedding_type=relative", "model.cp_comm_type=p2p", NO_SIZES], {}),
    ("seq-dataset-wins", ["dataset.seq_length=65536"], ["dataset.seq_length=131072"], {}),
    ("finetune-cp-loss-runner", FT, [*FT, "model.calculate_per_token_loss=true"], {}),
    ("finetune-cp-loss-runner", [*FT, "model.calculate_per_token_loss=true",
                                 "ddp.average_in_collective=true"],
     [*FT, "model.context_parallel_size=1", NO_SIZES, "model.cp_comm_type=p2p"], {}),
    ("dims-unknown", ["model.num_attention_heads=null", "model.num_query_groups=null"],
     ["model.num_attention_heads=null", "model.num_query_groups=null"], {"model_old": LLAMA8B}),
]


@pytest.mark.parametrize("rule,bad,good,kw", BOTH_WAYS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BOTH_WAYS)])
def test_rule_fires_and_its_neighbour_does_not(rule, bad, good, kw):
    kw = dict(kw)
    te_old, model_old = kw.pop("te_old", None), kw.pop("model_old", None)
    assert rule in rules(findings(*bad, **kw)), f"{rule} did not fire on {bad}"
    if te_old:
        kw["te_version"] = te_old
    if model_old:
        kw["model"] = model_old
    assert rule not in rules(findings(*good, **kw)), f"{rule} fired on {good}"


def test_every_bridge_rule_is_tested_both_ways():
    tested = {c[0] for c in BOTH_WAYS} | {"te-version-unknown", "seq-mismatch", "finetune-cp-loss",
                                          "thd-te-unknown"}  # test_validate_packed.py
    assert {r.id for r in RULES} <= tested


def test_allgather_is_an_error_with_the_spelling_as_fix():
    f = only("comm-type", "model.cp_comm_type=allgather", NO_SIZES)
    assert f.severity == "error" and f.fix == "model.cp_comm_type=all_gather"
    assert "'allgather'" in f.found and "Unsupported communication type" in f.found
    per_layer = only("comm-type", "model.num_layers=2", "model.cp_comm_type=[p2p,allgather]", NO_SIZES)
    assert per_layer.fix == "model.cp_comm_type=[p2p,all_gather]"


def test_per_layer_list_length_must_equal_num_layers():
    f = only("comm-type-layers", "model.cp_comm_type=[p2p,p2p]", NO_SIZES, model=LLAMA8B)
    assert "2 entries but num_layers = 32" in f.found
    assert f.fix == "model.cp_comm_type=p2p (one value applies to every layer)"


def test_sizes_product_shows_the_arithmetic_and_a_fix_inside_a_node():
    f = only("sizes-product", "model.hierarchical_context_parallel_sizes=[2,2]", cluster=H100)
    assert "a2a(2) * p2p(2) = 4 != context_parallel_size(8)" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_three_levels_rejected():
    f = only("two-levels", "model.hierarchical_context_parallel_sizes=[2,2,2]")
    assert "3 levels" in f.found


def test_seq_not_divisible_by_two_cp():
    f = only("seq-divisible", "model.seq_length=131000")
    assert "131000 is not divisible by 2*cp = 16" in f.found
    assert f.fix == "model.seq_length=131008 (or 130992)"


def test_silent_cp_off_is_explained_and_fixed_inside_a_node():
    f = only("silent-cp-off", NO_SIZES, cluster=H100)
    assert f.severity == "error"
    assert "TE computes cp_size=1" in f.found and "1/8 of the sequence" in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_silent_cp_off_at_cp1_suggests_p2p():
    f = only("silent-cp-off", NO_SIZES, "model.context_parallel_size=1")
    assert f.fix.startswith("model.cp_comm_type=p2p")


def test_kv_heads_not_divisible_by_a2a_at_tp2():
    f = only("heads-a2a", "model.tensor_model_parallel_size=2",
             "model.hierarchical_context_parallel_sizes=[8,1]")
    assert "KV heads/tp = 8/2 = 4" in f.found and "query" not in f.found
    assert f.fix == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_pure_a2a_needs_heads_divisible_by_cp():
    f = only("heads-a2a", "model.cp_comm_type=a2a", NO_SIZES, "model.context_parallel_size=16")
    assert "a2a size 16" in f.found
    assert f.fix.startswith("model.cp_comm_type=a2a+p2p ")


def test_odd_heads_under_a2a_names_the_per_rank_counts():
    f = only("heads-even-a2a", *ODD, te_version="2.17.1")
    assert "query heads/tp = 12/4 = 3 and KV heads/tp = 12/4 = 3" in f.found
    assert "no attention backend" in f.found
    assert f.fix == "model.cp_comm_type=p2p model.hierarchical_context_parallel_sizes=null"
    assert "heads-a2a" not in rules(findings(*ODD, te_version="2.17.1"))  # a separate rule


def test_odd_heads_fire_for_a2a_p2p_even_with_an_a2a_level_of_one():
    # TE's backend selection reads cp_comm_type, not the level sizes
    fs = findings(*ODD, "model.hierarchical_context_parallel_sizes=[1,6]", te_version="2.17.1")
    assert "heads-even-a2a" in rules(fs)


def test_tp_not_dividing_heads():
    assert only("heads-tp", "model.tensor_model_parallel_size=3").fix == \
        "model.tensor_model_parallel_size=2"


def test_query_heads_rule_uses_model_spec_when_config_has_none():
    base = [g for g in GOOD if "num_" not in g]
    fs = findings("model.context_parallel_size=16",
                  "model.hierarchical_context_parallel_sizes=[16,1]", base=base, model=LLAMA8B)
    assert "heads-a2a" in rules(fs)
    assert findings(base=base, model=LLAMA8B) == []


def test_unknown_heads_are_reported_not_guessed():
    fs = findings(base=[g for g in GOOD if "num_" not in g])
    assert rules(fs) == ["dims-unknown"] and fs[0].severity == "info"


@pytest.mark.parametrize("te,bad", [("1.11.0", True), ("1.12.0", False), ("2.9.0+abc", False)])
def test_te_minimum_version(te, bad):
    assert ("te-version" in rules(findings(te_version=te), "error")) == bad


def test_te_version_unknown_is_info(monkeypatch):
    monkeypatch.setattr("hcp_tune.space.validate.installed_te_version", lambda: None)
    fs = check(apply_overrides({}, GOOD), te_version=None)
    assert rules(fs) == ["te-version-unknown"] and fs[0].severity == "info"
    assert check(apply_overrides({}, [*GOOD, "model.cp_comm_type=p2p", NO_SIZES])) == []


def test_sliding_window_fix_is_a2a_when_the_heads_allow_it():
    f = only("sliding-window", "model.window_size=[128,0]")
    assert f.fix == "model.cp_comm_type=a2a model.hierarchical_context_parallel_sizes=null"
    f = only("sliding-window", "model.window_size=[128,0]", "model.tensor_model_parallel_size=2")
    assert f.fix.startswith("model.cp_comm_type=all_gather")  # 4 KV heads per rank, cp 8


def test_softmax_fix_is_a2a_or_vanilla():
    assert only("softmax-type", "model.softmax_type=off-by-one").fix.startswith("model.cp_comm_type=a2a")
    f = only("softmax-type", "model.softmax_type=off-by-one", "model.tensor_model_parallel_size=2")
    assert f.fix == "model.softmax_type=vanilla"


def test_dataset_seq_length_runs_and_is_the_one_checked():
    f = only("seq-dataset-wins", "dataset.seq_length=65000")
    assert f.severity == "warning" and "65000 runs" in f.found
    assert f.fix == "model.seq_length=65000"
    assert only("seq-divisible", "dataset.seq_length=65000").fix == \
        "dataset.seq_length=65008 (or 64992)"


def test_finetuning_with_cp_reports_what_the_runner_sets():
    f = only("finetune-cp-loss-runner", *FT)
    assert f.severity == "warning"
    assert "calculate_per_token_loss=false" in f.found and "run_recipe.py" in f.found
    assert f.fix == "model.calculate_per_token_loss=true ddp.average_in_collective=false"
    assert "finetune-cp-loss-runner" not in rules(findings("dataset.seq_length=131072"))  # pretrain


# ---------------------------------------------------------------- run_recipe.py --dry-run


def dry_run(**changes):
    tree = yaml.safe_load(DRY_RUN.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = tree
        for p in parents:
            node = node[p]
        node[leaf] = value
    return tree


def test_dry_run_output_is_read_and_clean():
    tree = read_config_file(str(DRY_RUN))
    assert check(tree, te_version="2.17.1", cluster=H100) == []


def test_dry_run_values_are_the_ones_that_run():
    fs = check(dry_run(model__calculate_per_token_loss=False), te_version="2.17.1")
    assert rules(fs) == ["finetune-cp-loss"] and fs[0].severity == "error"
    assert "resolved config" in fs[0].found
    fs = check(dry_run(ddp__average_in_collective=True), te_version="2.17.1")
    assert rules(fs) == ["finetune-cp-loss"]
    fs = check(dry_run(model__context_parallel_size=1, model__cp_comm_type="p2p",
                       model__hierarchical_context_parallel_sizes=None,
                       model__calculate_per_token_loss=False), te_version="2.17.1")
    assert fs == []


def test_dry_run_seq_mismatch_is_an_error():
    fs = check(dry_run(dataset__seq_length=65536), te_version="2.17.1")
    assert rules(fs) == ["seq-mismatch"]
    assert fs[0].fix == "model.seq_length=65536"
    assert check(dry_run(dataset__seq_length=131072), te_version="2.17.1") == []


def test_gpt_model_config_keeps_transformer_fields_nested():
    tree = dry_run()
    model = tree["model"]
    nested = {k: model.pop(k) for k in list(model) if k not in ("_target_", "seq_length")}
    tree["model"] = {"_target_": "megatron.bridge.models.gpt.gpt_builder.GPTModelConfig",
                     "seq_length": model["seq_length"],
                     "transformer": {"_target_": "megatron.bridge.models.transformer_config."
                                                 "TransformerConfig", **nested}}
    assert check(copy.deepcopy(tree), te_version="2.17.1") == []
    tree["model"]["transformer"]["hierarchical_context_parallel_sizes"] = None
    assert "silent-cp-off" in rules(check(tree, te_version="2.17.1"))


# ---------------------------------------------------------------- input errors (exit 2)


def test_suggest_sizes_falls_back_to_none_when_nothing_fits():
    assert suggest_sizes(8, 1, 1, 1, 8) is None
    assert suggest_sizes(8, 1, 32, 8, 8) == [4, 2]


def test_bad_cp_value_is_input_error():
    with pytest.raises(ConfigError, match=r"model.context_parallel_size='abc': expected an integer"):
        findings("model.context_parallel_size=abc")


@pytest.mark.parametrize("override,match", [
    ("model.window_size=128", r"model.window_size=128: expected a list of 2 integers"),
    ("model.hierarchical_context_parallel_sizes=[a,b]", "expected a list of integers"),
    ("model.calculate_per_token_loss=maybe", "expected true or false"),
    ("model.cp_comm_type=3", "expected p2p, a2a, all_gather, a2a\\+p2p"),
])
def test_wrongly_typed_fields_are_input_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        findings(override)


def test_config_file_errors(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        read_config_file(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputFileError, match="expected a mapping .* got list"):
        read_config_file(str(tmp_path / "list.yaml"))
    (tmp_path / "broken.yaml").write_text("model: [1, 2\n")
    with pytest.raises(InputFileError, match="not valid YAML at line"):
        read_config_file(str(tmp_path / "broken.yaml"))


def _pp_findings(**model):
    from hcp_tune.space.validate import check

    tree = {"model": {"context_parallel_size": 8, "cp_comm_type": "a2a+p2p",
                      "hierarchical_context_parallel_sizes": [2, 4], "seq_length": 131072,
                      "num_attention_heads": 32, "num_query_groups": 8, "num_layers": 32,
                      "tensor_model_parallel_size": 4, **model}}
    return {f.rule: f for f in check(tree, te_version="2.9.0")}


def test_layers_not_divisible_by_pp_is_an_error_with_the_largest_dividing_pp():
    found = _pp_findings(pipeline_model_parallel_size=3)["layers-pp"]
    assert found.severity == "error"
    assert found.found.startswith("num_layers 32 is not divisible by "
                                  "pipeline_model_parallel_size 3 (32 % 3 = 2)")
    assert found.fix == "model.pipeline_model_parallel_size=2"
    assert "layers-pp" not in _pp_findings(pipeline_model_parallel_size=2)
    assert "layers-pp" not in _pp_findings(pipeline_model_parallel_size=3,
                                           account_for_loss_in_pipeline_split=True)


def test_pp_stage_placement_is_flagged_when_tp_cp_blocks_straddle_nodes():
    from hcp_tune.upstream.rules import BY_ID, Facts, evaluate

    rule = (BY_ID["pp-stage-placement"],)
    bad = Facts(cp=6, tp=2, pp=2, gpus_per_node=8)  # blocks of 12 ranks on 8-GPU nodes
    (f,) = evaluate(bad, rule)
    assert f.severity == "warning" and "tp*cp = 2*6 = 12" in f.found
    assert evaluate(Facts(cp=8, tp=4, pp=2, gpus_per_node=8), rule) == []  # 32: 4 nodes
    assert evaluate(Facts(cp=2, tp=2, pp=2, gpus_per_node=8), rule) == []  # 4 divides 8
    assert evaluate(Facts(cp=6, tp=2, pp=1, gpus_per_node=8), rule) == []  # one stage


def test_plan_rejects_every_layout_when_pp_does_not_divide_the_layers():
    from hcp_tune import config
    from hcp_tune.space import plan

    cfg = config.load(["cp=4", "seq=65536", "tp=1", "pp=3", "model=llama3-8b"])
    cands = plan.candidates(cfg)
    assert cands and not any(c.kept for c in cands)
    assert all("[layers-pp]" in c.reasons[0] for c in cands)
