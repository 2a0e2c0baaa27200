"""runner=bridge: the trial's Bridge config as data, and Bridge's FLOP count ported.

Megatron-Bridge cannot be imported here (its package imports Transformer Engine), so the
config is checked as the mapping the job applies, against the ConfigContainer field names
read from Megatron-Bridge v0.6.0 (51885cf132b2) and its Megatron-LM (cd4afffa648426a9):
tests/data/bridge_fields.json, written by scripts/bridge_fields.py from those sources.
"""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hcp_tune.flops import bridge_gpt_flops, padded_vocab_size
from hcp_tune.job.bridge import config as bc
from hcp_tune.spec import TrialSpec

FIELDS = json.loads((Path(__file__).parents[2] / "data" / "bridge_fields.json").read_text())


def spec(a2a=2, p2p=2, **kw):
    base = dict(trial_id="t", a2a=a2a, p2p=p2p, seq=256, heads=8, kv_heads=8, head_dim=8,
                hidden=64, ffn_hidden=256, layers=2, vocab=1024, runner="bridge",
                warmup_steps=2, measure_steps=5)
    base.update(kw)
    return TrialSpec(**base)


def test_pinned_field_list_is_from_the_pinned_commit():
    assert FIELDS["bridge"].endswith(bc.BRIDGE_COMMIT)
    assert set(FIELDS["container"]) - {"_checkpoint_load_required"} == bc.CONTAINER_FIELDS


@pytest.mark.parametrize("layout", [(2, 2), (1, 4), (4, 1), (1, 1)])
@pytest.mark.parametrize("recipe", [None, "llama3_8b_pretrain_config"])
def test_every_path_exists_in_bridge_configcontainer(layout, recipe):
    fields = bc.bridge_fields(spec(*layout, bridge_recipe=recipe))
    for path in bc.container_paths(fields):
        head, _, rest = path.partition(".")
        assert head in FIELDS["container"], path
        if rest:
            assert head in FIELDS["sections"], f"{path}: section {head} not pinned"
            assert rest in FIELDS["sections"][head], f"{path} is not a field at {FIELDS['bridge']}"
    if recipe:  # the mock dataset built in place of the recipe's data
        for name in fields["dataset"].kwargs:
            assert name in FIELDS["sections"]["dataset"], name


def test_hierarchical_layout_fields():
    f = bc.bridge_fields(spec(2, 2, tp=2))
    assert f["model.context_parallel_size"] == 4
    assert f["model.cp_comm_type"] == "a2a+p2p"
    assert f["model.hierarchical_context_parallel_sizes"] == [2, 2]
    assert f["model.tensor_model_parallel_size"] == 2
    assert f["model.sequence_parallel"] is True
    assert f["model.seq_length"] == f["dataset.seq_length"] == 256
    assert f["dist.use_decentralized_pg"] is False


@pytest.mark.parametrize("a2a,p2p,comm", [(1, 4, "p2p"), (4, 1, "a2a")])
def test_baselines_run_without_hcp_sizes(a2a, p2p, comm):
    f = bc.bridge_fields(spec(a2a, p2p))
    assert f["model.cp_comm_type"] == comm
    assert f["model.hierarchical_context_parallel_sizes"] is None
    assert f["model.context_parallel_size"] == 4


def test_model_run_and_data_fields():
    f = bc.bridge_fields(spec(mbs=2, dtype="bf16", seed=7))
    assert (f["model.num_layers"], f["model.hidden_size"], f["model.ffn_hidden_size"]) == (2, 64, 256)
    assert (f["model.num_attention_heads"], f["model.num_query_groups"], f["model.kv_channels"]) == (8, 8, 8)
    assert f["tokenizer.tokenizer_type"] == "NullTokenizer" and f["tokenizer.vocab_size"] == 1024
    assert f["train.train_iters"] == 7  # 2 warm-up + 5 measured
    assert f["train.micro_batch_size"] == 2 and f["train.global_batch_size"] == 2
    assert f["checkpoint.save"] is None and f["validation.eval_iters"] == 0
    assert f["mixed_precision"] == "bf16_mixed"
    assert f["model.activation_func"] == bc.Ref("torch.nn.functional:silu")
    assert f["rng.seed"] == 7 and f["dataset.random_seed"] == 7


def test_recipe_mode_keeps_the_recipe_model_and_sets_the_layout():
    f = bc.bridge_fields(spec(2, 2, bridge_recipe="llama3_8b_pretrain_config"))
    assert f["recipe"] == "llama3_8b_pretrain_config"
    assert "model.num_layers" not in f and "model.hidden_size" not in f
    assert f["model.hierarchical_context_parallel_sizes"] == [2, 2]
    assert f["dataset"].cls.endswith(":MockGPTDatasetConfig")
    assert f["dataset"].kwargs["seq_length"] == 256


def test_overrides_apply_last_and_win():
    f = bc.bridge_fields(spec(bridge_overrides=[
        "model.seq_length=512", "train.global_batch_size=8", "model.recompute_granularity=full",
        "model.hierarchical_context_parallel_sizes=[4,1]"]))
    keys = list(f)
    assert keys[-4:] == ["model.seq_length", "train.global_batch_size",
                         "model.recompute_granularity", "model.hierarchical_context_parallel_sizes"]
    assert f["model.seq_length"] == 512 and f["train.global_batch_size"] == 8
    assert f["model.hierarchical_context_parallel_sizes"] == [4, 1]
    assert f["model.recompute_granularity"] == "full"


@pytest.mark.parametrize("text,value", [
    ("4", 4), ("3e-4", 3e-4), ("true", True), ("False", False), ("null", None),
    ("[2,4]", [2, 4]), ("a2a+p2p", "a2a+p2p"), ("'x y'", "x y"), ("[a2a, p2p]", ["a2a", "p2p"]),
])
def test_override_values(text, value):
    assert bc.parse_value(text) == value


def test_bad_overrides_are_reported_together():
    with pytest.raises(bc.BridgeConfigError) as e:
        bc.parse_overrides(["model.cp_comm_type", "modle.seq_length=4", "train.train_iters=3"])
    msg = str(e.value)
    assert "'model.cp_comm_type': expected KEY=VALUE" in msg
    assert "'modle' is not a ConfigContainer section" in msg
    assert "train.train_iters" not in msg


def test_missing_model_dimensions_name_the_fix():
    with pytest.raises(bc.BridgeConfigError, match="needs the model's hidden, ffn_hidden"):
        bc.bridge_fields(spec(hidden=0, ffn_hidden=0))


def test_apply_fields_sets_paths_in_order_and_rejects_unknown_ones():
    import math

    old_model = SimpleNamespace(seq_length=1, activation_func=None)
    root = SimpleNamespace(model=old_model, train=SimpleNamespace(train_iters=0),
                           mixed_precision=None)
    new_model = SimpleNamespace(seq_length=2, activation_func=None)
    # in order: the path under "model" lands on the object "model" was replaced by
    bc.apply_fields(root, {"model.seq_length": 8, "train.train_iters": 3, "model": new_model,
                           "model.activation_func": bc.Ref("math:sqrt"),
                           "mixed_precision": "bf16_mixed"})
    assert root.model is new_model and old_model.seq_length == 8
    assert new_model.seq_length == 2 and new_model.activation_func is math.sqrt
    assert root.train.train_iters == 3 and root.mixed_precision == "bf16_mixed"
    with pytest.raises(bc.BridgeConfigError, match="model.seqlen: no field 'seqlen'"):
        bc.apply_fields(root, {"model.seqlen": 4})
    with pytest.raises(bc.BridgeConfigError, match="optim.lr: optim does not exist"):
        bc.apply_fields(root, {"optim.lr": 4})


def test_summary_is_json():
    f = bc.bridge_fields(spec(bridge_recipe="llama3_8b_pretrain_config"))
    text = json.dumps(bc.summary(f))
    assert "MockGPTDatasetConfig" in text


# ---------------------------------------------------------------- Bridge's FLOP count

def test_padded_vocab():
    assert padded_vocab_size(1024) == 1024
    assert padded_vocab_size(1025) == 1152
    assert padded_vocab_size(32000, 128, 8) == 32768  # multiple of 1024
    assert padded_vocab_size(128256, 128, 1) == 128256


def test_bridge_flops_tiny_by_hand():
    # tiny model, seq 256, one sequence. Per token:
    #   MLP      6*64*256*3*2                       =   589,824
    #   attn     6*2*(64*(64+2*64) + 64*64 + 64*256) = 12*(12,288+4,096+16,384) = 393,216
    #   logits   6*64*1024                          =   393,216
    #   total 1,376,256 per token * 256 tokens      = 352,321,536
    got = bridge_gpt_flops(batch=1, seq=256, layers=2, hidden=64, ffn_hidden=256, heads=8,
                           kv_heads=8, head_dim=8, vocab=1024)
    assert got == 352_321_536


def test_bridge_flops_llama3_8b_by_hand():
    # Llama-3-8B: 32 layers, hidden 4096, ffn 14336, 32 heads, 8 KV heads, d 128, vocab
    # 128256 (padded to 128256), seq 8192, batch 1. Per token:
    #   MLP     6*4096*14336*3*32              = 33,822,867,456
    #   attn    6*32*(4096*(4096+2*1024) + 4096*4096 + 4096*8192)
    #         = 192*(25,165,824 + 16,777,216 + 33,554,432) = 192*75,497,472 = 14,495,514,624
    #   logits  6*4096*128256                  =  3,152,019,456
    #   per token 51,470,401,536; * 8192 tokens = 421,645,529,382,912
    got = bridge_gpt_flops(batch=1, seq=8192, layers=32, hidden=4096, ffn_hidden=14336,
                           heads=32, kv_heads=8, head_dim=128, vocab=128256)
    assert got == 421_645_529_382_912


def test_bridge_flops_scale_with_batch_and_gqa_only_shrinks_kv():
    one = bridge_gpt_flops(batch=1, seq=512, layers=2, hidden=64, ffn_hidden=256, heads=8,
                           kv_heads=8, head_dim=8, vocab=1024)
    assert bridge_gpt_flops(batch=4, seq=512, layers=2, hidden=64, ffn_hidden=256, heads=8,
                            kv_heads=8, head_dim=8, vocab=1024) == 4 * one
    gqa = bridge_gpt_flops(batch=1, seq=512, layers=2, hidden=64, ffn_hidden=256, heads=8,
                           kv_heads=2, head_dim=8, vocab=1024)
    # K and V projections: 6*layers*hidden*2*head_dim*(8-2) per token fewer
    assert one - gqa == 512 * 6 * 2 * 64 * 2 * 8 * 6


# ---------------------------------------------------------------- building the container
# Bridge is not importable here: ``resolve`` is replaced by plain namespaces standing in for
# Bridge's classes, so what is checked is how the mapping becomes constructor arguments and
# attribute writes, in order.

SILU = object()


def fake_resolve(path):
    if path == "torch.nn.functional:silu":
        return SILU
    if path == "my_recipes:tiny_recipe":
        return lambda: SimpleNamespace(
            model=SimpleNamespace(num_layers=32, seq_length=4096, context_parallel_size=1,
                                  tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                  sequence_parallel=False, cp_comm_type="p2p",
                                  hierarchical_context_parallel_sizes=None),
            train=SimpleNamespace(train_iters=1000, micro_batch_size=1, global_batch_size=512),
            validation=SimpleNamespace(eval_iters=10),
            checkpoint=SimpleNamespace(save="/ckpt", load=None),
            logger=SimpleNamespace(log_interval=10, log_throughput=False),
            dist=SimpleNamespace(use_decentralized_pg=False, distributed_timeout_minutes=10,
                                 distributed_timeout_seconds_after_init=None),
            rng=SimpleNamespace(seed=1), dataset=None,
            scheduler=SimpleNamespace(lr_warmup_iters=2000, lr_decay_iters=None),
            tokenizer=SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", vocab_size=None),
            mixed_precision="bf16_mixed")
    return lambda **kw: SimpleNamespace(_cls=path, **kw)


def test_build_container_scratch_mode(monkeypatch):
    monkeypatch.setattr(bc, "resolve", fake_resolve)
    cfg = bc.build_container(bc.bridge_fields(spec(2, 2, bridge_overrides=["model.seq_length=512"])))
    assert cfg._cls.endswith(":ConfigContainer")
    assert cfg.model._cls.endswith("gpt_provider:GPTModelProvider")
    assert cfg.dataset._cls.endswith(":MockGPTDatasetConfig")
    assert (cfg.model.context_parallel_size, cfg.model.cp_comm_type,
            cfg.model.hierarchical_context_parallel_sizes) == (4, "a2a+p2p", [2, 2])
    assert cfg.model.activation_func is SILU and cfg.mixed_precision == "bf16_mixed"
    assert cfg.model.seq_length == 512 and cfg.dataset.seq_length == 256  # the override won
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.checkpoint.save is None
    assert cfg.dist.use_decentralized_pg is False and cfg.train.train_iters == 7


def test_build_container_recipe_mode_keeps_the_recipe_model(monkeypatch):
    monkeypatch.setattr(bc, "resolve", fake_resolve)
    cfg = bc.build_container(bc.bridge_fields(spec(2, 2, bridge_recipe="my_recipes:tiny_recipe")))
    assert cfg.model.num_layers == 32  # the recipe's
    assert cfg.model.seq_length == 256 and cfg.model.hierarchical_context_parallel_sizes == [2, 2]
    assert cfg.dataset._cls.endswith(":MockGPTDatasetConfig") and cfg.dataset.seq_length == 256
    assert cfg.train.global_batch_size == 1 and cfg.train.train_iters == 7
    assert cfg.checkpoint.save is None and cfg.validation.eval_iters == 0
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer"
    assert (cfg.scheduler.lr_warmup_iters, cfg.scheduler.lr_decay_iters) == (1, 7)


# ---------------------------------------------------------------- the callback API

def test_pretrain_takes_callbacks_at_the_pinned_version():
    assert FIELDS["pretrain_args"] == ["config", "forward_step_func", "callbacks"]


def test_our_callbacks_define_only_bridge_events():
    from hcp_tune.job.bridge.guard import HCPGuard
    from hcp_tune.job.bridge.measure import StepRecorder
    from hcp_tune.job.bridge.runner import _Fingerprint

    events = set(FIELDS["callback_events"])
    for cls in (StepRecorder, HCPGuard, _Fingerprint):
        hooks = {n for n in vars(cls) if n.startswith("on_")}
        assert hooks and hooks <= events, (cls.__name__, hooks - events)


def test_the_comm_timeout_grows_with_the_world_until_the_first_iteration_ends():
    """issue 19: distributed_timeout_minutes was comm_timeout_s (2 minutes), tight for the
    first iteration of a large world; after it Bridge switches to the seconds given."""
    from hcp_tune.job.bridge.config import distributed_timeout_minutes

    small = spec(a2a=1, p2p=2, comm_timeout_s=120.0, time_limit_s=3600.0)
    big = spec(a2a=2, p2p=4, tp=4, pp=2, comm_timeout_s=120.0, time_limit_s=3600.0)  # 64 GPUs
    assert distributed_timeout_minutes(small) == 5 and distributed_timeout_minutes(big) == 6
    assert distributed_timeout_minutes(spec(comm_timeout_s=900.0, time_limit_s=3600.0)) == 15
    assert distributed_timeout_minutes(spec(comm_timeout_s=120.0, time_limit_s=180.0)) == 3
    f = bc.bridge_fields(big)
    # issue 30: after step 1 the groups kept comm_timeout_s (120 s), which one step at
    # m = 3*pp and 128K can pass; they keep the first iteration's timeout now
    assert f["dist.distributed_timeout_seconds_after_init"] == 6 * 60
    assert bc.bridge_fields(spec(comm_timeout_s=900.0, time_limit_s=3600.0))[
        "dist.distributed_timeout_seconds_after_init"] == 900
    assert (f["model.pipeline_model_parallel_size"], f["train.global_batch_size"]) == (2, 1)


def test_the_whole_world_and_the_micro_batches_reach_the_config():
    f = bc.bridge_fields(spec(a2a=2, p2p=2, tp=2, pp=4, dp=2, mbs=2, micro_batches=8, vp=2))
    assert f["model.pipeline_model_parallel_size"] == 4
    assert f["model.virtual_pipeline_model_parallel_size"] == 2
    assert (f["train.micro_batch_size"], f["train.global_batch_size"]) == (2, 2 * 2 * 8)
    # recipe mode keeps the recipe's virtual pipeline unless the sweep sets one
    assert "model.virtual_pipeline_model_parallel_size" not in bc.bridge_fields(
        spec(pp=2, bridge_recipe="llama3_70b_pretrain_config"))


def test_stop_check_ends_every_rank_on_the_step_one_rank_saw_the_stop_file(tmp_path):
    from types import SimpleNamespace

    from hcp_tune.job.bridge.control import STOP_FILE, StopCheck

    stop = tmp_path / "t.stop"
    seen = []  # what each rank proposed; agree() is the all-reduce MAX over ranks
    ranks = [StopCheck(stop_path=str(stop) if r == 1 else None, time_limit_s=60, t0=0.0,
                       clock=lambda: 1.0, agree=lambda v: seen.append(v) or max(seen[-2:]))
             for r in (0, 1)]
    ctx = SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=3),
                                                cfg=SimpleNamespace(train=SimpleNamespace(
                                                    train_iters=10))))
    ranks[0].on_train_step_start(ctx)
    ranks[1].on_train_step_start(ctx)
    assert not any(r.stopped for r in ranks) and ctx.state.cfg.train.train_iters == 10
    stop.write_text("early stop")
    seen.clear()
    ranks[1].on_train_step_start(ctx)  # the rank that sees the file
    ranks[0].on_train_step_start(ctx)  # agree(): the maximum of both proposals
    assert ranks[0].reason == STOP_FILE and ctx.state.cfg.train.train_iters == 4


# ---------------------------------------------------------------- issue 30

@pytest.mark.parametrize("recipe", [None, "llama3_8b_pretrain_config"])
def test_the_mock_data_builds_no_seq_by_seq_attention_mask(recipe):
    """Megatron-Core's GPTDatasetConfig defaults create_attention_mask to True: every sample
    then carries a tril(ones(S, S)) on the host (16 GiB a sample at 128K), which Bridge's
    step drops. Set off in both modes (recipe mode: in the mock dataset's arguments)."""
    f = bc.bridge_fields(spec(seq=131072, bridge_recipe=recipe))
    data = f["dataset"].kwargs if recipe else {
        k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("dataset.")}
    assert data["create_attention_mask"] is False
    assert "create_attention_mask" in FIELDS["sections"]["dataset"]  # a real field


def test_scratch_mode_runs_with_the_llama_recipes_environment_and_fusions():
    """issue 30: scratch mode set none of the recipes' environment (NVLS off, expandable
    segments, NCCL stream settings) nor their fusions, and one data-loader worker."""
    from hcp_tune.job.bridge.parity import LLAMA_FUSIONS, RECIPE_ENV_VARS, recipe_parity

    f = bc.bridge_fields(spec())
    assert f["env_vars"] == RECIPE_ENV_VARS and f["env_vars"]["NCCL_NVLS_ENABLE"] == 0
    assert f["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert all(f[k] == v for k, v in LLAMA_FUSIONS.items()) and f["dataset.num_workers"] == 8
    # issue 38: automatic GC off during the timed steps, as the recipes run
    assert f["train.manual_gc"] is True and f["train.manual_gc_interval"] == 100
    parity = recipe_parity(f)
    assert parity["gc"] == {"train.manual_gc": True, "train.manual_gc_interval": 100}
    assert parity["mode"] == "scratch" and parity["env_vars"] == RECIPE_ENV_VARS
    assert [x.split(" ")[0] for x in parity["not_applied"]] == ["model.rotary_base",
                                                                "model.rope_scaling"]
    # an override that turns one off is reported as not applied
    off = recipe_parity(bc.bridge_fields(spec(bridge_overrides=["model.apply_rope_fusion=false"])))
    assert "model.apply_rope_fusion" in off["not_applied"]
    gc_on = recipe_parity(bc.bridge_fields(spec(bridge_overrides=["train.manual_gc=false"])))
    assert "train.manual_gc" in gc_on["not_applied"] and gc_on["gc"]["train.manual_gc"] is False
    # recipe mode keeps the recipe's own
    f = bc.bridge_fields(spec(bridge_recipe="llama3_8b_pretrain_config"))
    assert "env_vars" not in f and recipe_parity(f)["mode"] == "recipe"


def test_the_scratch_container_gets_the_env_vars_and_fusions(monkeypatch):
    monkeypatch.setattr(bc, "resolve", fake_resolve)
    cfg = bc.build_container(bc.bridge_fields(spec()))
    assert cfg.env_vars["NCCL_GRAPH_REGISTER"] == 0
    assert cfg.model.apply_rope_fusion is True and cfg.model.cross_entropy_fusion_impl == "te"
    assert cfg.dataset.create_attention_mask is False
