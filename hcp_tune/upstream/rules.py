"""Every HCP rule once: its id, the Bridge fields it reads, its severity, where upstream
enforces it, and a check that returns what was found (with the arithmetic) and the exact
override that fixes it.

Who asks this table: ``layout.enumerate_layouts`` (why ``plan`` rejects or flags a layout),
``validate.check`` (findings on a Bridge config), ``config.SweepConfig`` (tp must divide the
heads) and ``costmodel._check`` (it predicts legal layouts only). A rule reads a ``Facts``
record, so a layout and a Bridge config are checked by the same code and report the same
id and fix. Pure functions over numbers: no torch, no files. The checks sit by the upstream
project they restate (``te``, ``te_packed`` for packed sequences, ``mcore``, ``bridge``; the
parts in ``facts``); this module is the table that orders them. Upstream sources read for each
rule are named in ``Rule.source`` (TE = TransformerEngine
``transformer_engine/pytorch/attention/dot_product_attention/``, BCFG = Megatron-Bridge
``src/megatron/bridge/training/config.py``).
"""
from __future__ import annotations

import re

from hcp_tune.errors import ConfigError
from hcp_tune.upstream import bridge, mcore, te, te_packed
from hcp_tune.upstream.facts import (  # noqa: F401  (the table's users import them from here)
    SEVERITY_ORDER,
    SIZES_KEY,
    Check,
    Facts,
    Finding,
    Rule,
    Severity,
    sizes_fix,
    suggest_sizes,
)
from hcp_tune.upstream.te import COMM_TYPES, TE_EVEN_HEADS  # noqa: F401
from hcp_tune.upstream.te_packed import PACKING_KEYS, TE_THD_HCP  # noqa: F401


def _dims_unknown(f: Facts):
    missing = []
    if f.heads is None and f.a2a > 1:
        missing.append("head counts (model.num_attention_heads/num_query_groups): head "
                       "divisibility")
    if f.per_layer and f.num_layers is None and f.cp > 1:
        missing.append("model.num_layers: the per-layer cp_comm_type length")
    if not missing:
        return None
    return ("unknown " + "; ".join(missing) + " not checked",
            "give the missing fields, or model=NAME (an hcp-tune model spec)")


# ------------------------------------------------------------------ the table

M = "model."
RULES: tuple[Rule, ...] = (
    Rule("comm-type", "error", (M + "cp_comm_type",),
         "cp_comm_type is p2p, a2a, all_gather or a2a+p2p (`allgather` is not TE's spelling)",
         "TE context_parallel.py attn_forward_func_with_cp", te.comm_type),
    Rule("comm-type-layers", "error", (M + "cp_comm_type", M + "num_layers"),
         "a per-layer cp_comm_type list has one entry per layer",
         "BCFG _validate_cp_comm_type; Megatron-Core transformer_config.py",
         bridge.comm_type_layers),
    Rule("silent-cp-off", "error", (M + "cp_comm_type", SIZES_KEY),
         "a2a+p2p without sizes, at any CP: TE gets no group, computes cp_size=1 and every rank "
         "attends to its own chunk only, fast and wrong",
         "BCFG _validate_cp_comm_type; Megatron-Core TEDotProductAttention", bridge.silent_cp_off),
    Rule("two-levels", "error", (SIZES_KEY,), "exactly two levels: TE runs [a2a, p2p] only",
         "TE context_parallel.py (cp_group = [a2a, p2p])", te.two_levels),
    Rule("sizes-product", "error", (SIZES_KEY, M + "context_parallel_size"),
         "the sizes multiply to cp (whenever they are set)", "BCFG _validate_cp_comm_type",
         bridge.sizes_product),
    Rule("sizes-ignored", "warning", (SIZES_KEY, M + "cp_comm_type"),
         "sizes without a2a+p2p do nothing", "TE / Megatron-Core (sizes read for a2a+p2p only)",
         mcore.sizes_ignored),
    Rule("seq-divisible", "error", (M + "seq_length", "dataset.seq_length",
                                    M + "context_parallel_size"),
         "seq % (2*cp) == 0: load-balanced causal chunks (rank i holds chunks i and 2cp-1-i)",
         "BCFG validate; TE context_parallel.py", te.seq_divisible, layout=True),
    Rule("heads-tp", "error", (M + "num_attention_heads", M + "num_query_groups",
                               M + "tensor_model_parallel_size"),
         "tp divides heads and KV heads: Megatron-Core splits both over TP",
         "Megatron-Core transformer_config.py", mcore.heads_tp, layout=True),
    Rule("heads-a2a", "error", (M + "num_attention_heads", M + "num_query_groups", SIZES_KEY),
         "the a2a size divides the per-TP-rank heads and KV heads (pure a2a: cp divides them)",
         "TE context_parallel.py (a2a scatters heads; a shape error for a2a+p2p)", te.heads_a2a,
         layout=True),
    Rule("heads-even-a2a", "error", (M + "num_attention_heads", M + "num_query_groups",
                                     M + "cp_comm_type"),
         "under a2a or a2a+p2p the per-TP-rank heads and KV heads are even (TE >= 2.15, sbhd)",
         "TE utils.py get_attention_backend (v2.15+, read at v2.17.1); context_parallel.py "
         "refuses FlashAttention with sbhd under CP", te.heads_even_a2a, layout=True),
    Rule("dims-unknown", "info", (M + "num_attention_heads", M + "num_layers"),
         "the model's dimensions are needed for the head and layer rules", "-", _dims_unknown),
    Rule("a2a-cross-node", "warning", (M + "tensor_model_parallel_size", SIZES_KEY),
         "tp*a2a <= GPUs per node: the all-to-all should stay on NVLink",
         "placement (hcp-facts.md section 2)", mcore.a2a_cross_node, layout=True),
    Rule("layers-pp", "error", (M + "num_layers", M + "pipeline_model_parallel_size"),
         "num_layers divisible by pp (the plain case: no uneven first/last stage, no "
         "pipeline layout, no account_for_*_in_pipeline_split)",
         "Megatron-Core transformer_block.py get_num_layers_to_build", mcore.layers_pp,
         layout=True),
    Rule("pp-stage-placement", "warning", (M + "pipeline_model_parallel_size",
         M + "tensor_model_parallel_size", M + "context_parallel_size"),
         "with pp > 1, every stage's CP groups sit alike on nodes only when tp*cp divides "
         "or is a multiple of the GPUs per node",
         "placement: order tp-cp-ep-dp-pp (parallel_state.RankGenerator)", mcore.pp_stage_placement,
         layout=True),
    Rule("decentralized-pg", "error", ("dist.use_decentralized_pg", SIZES_KEY),
         "dist.use_decentralized_pg=false with HCP", "Bridge training/initialize.py",
         bridge.decentralized),
    Rule("te-version", "error", ("te_version",), "Transformer Engine >= 1.12 for a2a+p2p",
         "Megatron-Core extensions/transformer_engine.py", te.te_version),
    Rule("te-version-unknown", "info", ("te_version",), "TE's version could not be checked",
         "-", te.te_version_unknown),
    Rule("te-thd", "error", PACKING_KEYS + (M + "cp_comm_type", "te_version"),
         "packed (THD) with a2a+p2p needs TE >= 2.19; NeMo 26.08/26.08.01 and Bridge 0.6.x "
         "ship 2.18", "TE context_parallel.py attn_forward_func_with_cp (asserted up to 2.18; "
         "TE #3290, release_v2.19)", te_packed.te_thd),
    Rule("thd-pad-detect", "error", PACKING_KEYS + (M + "cp_comm_type", "te_version",
                                                    "pad_between_seqs"),
         "packed with p2p or a2a+p2p on TE <= 2.17.1 needs pad_between_seqs=True (Bridge leaves "
         "it to TE's detection, blind to tail padding: silently wrong attention)",
         "TE dot_product_attention.py pad_between_seqs detection; TE #3331",
         te_packed.thd_pad_detect),
    Rule("thd-padded-identity", "info", PACKING_KEYS + (M + "cp_comm_type", "te_version"),
         "packed with p2p or a2a+p2p on TE >= 2.18: Bridge's separate padded cu_seqlens tensor "
         "takes the slower exact per-rank path", "TE dot_product_attention.py (TE #2898); "
         "TE #3487 (open)", te_packed.thd_padded_identity),
    Rule("thd-no-backend", "error", PACKING_KEYS + (M + "num_attention_heads",
                                                    M + "num_query_groups", M + "cp_comm_type"),
         "packed with padding between documents under a2a or a2a+p2p needs even per-TP-rank "
         "heads and KV heads: no attention backend is left otherwise",
         "TE utils.py get_attention_backend (the THD and CP filters)", te_packed.thd_no_backend,
         layout=True),
    Rule("thd-te-unknown", "info", PACKING_KEYS + (M + "cp_comm_type", "te_version"),
         "packed with p2p or a2a+p2p: what runs depends on TE's version (2.17.1, 2.18, 2.19)",
         "TE #3290, #3331, #3487", te_packed.thd_te_unknown, layout=True),
    Rule("thd-doc-padding", "info", PACKING_KEYS + (M + "context_parallel_size",),
         "packed under CP: every document is padded to a multiple of 2*cp (its padding cost "
         "depends on the mix)", "Megatron-Core utils.py, TE thd_get_partitioned_indices; Bridge "
         "recipe_runner.py sync_offline_packing_alignment", te_packed.thd_doc_padding),
    Rule("sliding-window", "error", (M + "window_size", M + "cp_comm_type"),
         "a sliding window runs with a2a and all_gather, not p2p or a2a+p2p; (-1,0) and "
         "(-1,-1) are not sliding", "TE context_parallel.py attn_forward_func_with_cp",
         te.sliding_window),
    Rule("softmax-type", "error", (M + "softmax_type", M + "cp_comm_type"),
         "a non-vanilla softmax runs only with a2a", "TE context_parallel.py; utils.py",
         te.softmax_type),
    Rule("attention-bias", "error", (M + "position_embedding_type", M + "cp_comm_type"),
         "an attention bias (relative position embedding) runs only with p2p",
         "TE utils.py get_attention_backend; context_parallel.py", te.attention_bias),
    Rule("seq-dataset-wins", "warning", (M + "seq_length", "dataset.seq_length"),
         "model.seq_length differs from dataset.seq_length: the dataset's runs",
         "Bridge scripts/training/run_recipe.py (0.4+; recipe_runner.py in 0.6+)",
         bridge.seq_dataset_wins),
    Rule("seq-mismatch", "error", (M + "seq_length", "dataset.seq_length"),
         "in a resolved config the two lengths are equal", "BCFG validate", bridge.seq_mismatch),
    Rule("finetune-cp-loss-runner", "warning", (M + "calculate_per_token_loss",
                                                "ddp.average_in_collective", "dataset"),
         "finetuning with CP>1: run_recipe.py sets per-token loss and no in-collective "
         "averaging itself", "Bridge scripts/training/recipe_runner.py "
         "(sync_finetuning_cp_invariants, 0.6+)", bridge.finetune_runner),
    Rule("finetune-cp-loss", "error", (M + "calculate_per_token_loss",
                                       "ddp.average_in_collective", "dataset"),
         "finetuning with CP>1 needs calculate_per_token_loss=true and "
         "average_in_collective=false", "BCFG validate", bridge.finetune_cp_loss),
)
BY_ID = {r.id: r for r in RULES}
LAYOUT_RULES = tuple(r for r in RULES if r.layout)


def evaluate(facts: Facts, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """The findings of ``rules`` on ``facts``, errors first."""
    out = []
    for rule in rules:
        got = rule.check(facts)
        if got is not None:
            out.append(Finding(rule.severity, rule.id, *got))
    return sorted(out, key=lambda f: SEVERITY_ORDER[f.severity])


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.17.1+4329ff8`` -> (2, 17, 1); a ``ConfigError`` when there is no number."""
    nums = re.findall(r"\d+", str(text).split("+")[0])
    if not nums:
        raise ConfigError(f"te_version={text!r}: expected a version such as 2.9.0")
    return tuple(int(n) for n in nums[:3])
