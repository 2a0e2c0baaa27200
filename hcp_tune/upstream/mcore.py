"""The HCP rules that restate Megatron-Core (``transformer_config.py``,
``transformer_block.py``, ``parallel_state.RankGenerator``'s placement): TP splits the heads,
the pipeline splits the layers, where a CP group's ranks sit on nodes, and what it passes
TE for each communication type. Each check returns (what was found, the fix) or None.
"""
from __future__ import annotations

from hcp_tune.upstream.facts import SIZES_KEY, Facts, sizes_fix


def sizes_ignored(f: Facts):
    if not f.sizes or f.hcp:
        return None
    return (f"{SIZES_KEY}={list(f.sizes)} is set but cp_comm_type={'/'.join(f.comm_types)}: "
            "the sizes are used only by a2a+p2p, so they do nothing here",
            f"model.cp_comm_type=a2a+p2p to use them, or {SIZES_KEY}=null")


def heads_tp(f: Facts):
    if f.heads is None or f.per_rank() is not None:
        return None
    best = max(d for d in range(1, f.tp + 1) if f.heads % d == 0 and f.kv % d == 0)
    return (f"tp={f.tp} does not divide the heads ({f.heads}) and KV heads ({f.kv}): "
            "Megatron-Core splits both across TP ranks",
            f"model.tensor_model_parallel_size={best}")


def a2a_cross_node(f: Facts):
    if f.gpus_per_node is None or f.a2a == 1 or f.tp * f.a2a <= f.gpus_per_node:
        return None
    drop = " (dropped: drop_cross_node_a2a=true)" if f.drop_cross_node_a2a else ""
    return (f"a2a level crosses nodes: tp*a2a = {f.tp}*{f.a2a} = {f.tp * f.a2a} > "
            f"{f.gpus_per_node} GPUs per node, so its all-to-all runs on inter-node links{drop}",
            sizes_fix(f))


def layers_pp(f: Facts):
    if f.pp == 1 or f.num_layers is None or not f.pp_plain or f.num_layers % f.pp == 0:
        return None
    best = max(d for d in range(1, f.pp + 1) if f.num_layers % d == 0)
    return (f"num_layers {f.num_layers} is not divisible by pipeline_model_parallel_size "
            f"{f.pp} ({f.num_layers} % {f.pp} = {f.num_layers % f.pp}): Megatron-Core asserts "
            "\"num_layers should be divisible by pipeline_model_parallel_size\"",
            f"model.pipeline_model_parallel_size={best}")


def pp_stage_placement(f: Facts):
    block, g = f.tp * f.cp, f.gpus_per_node
    if f.pp == 1 or f.cp == 1 or g is None or block % g == 0 or g % block == 0:
        return None
    return (f"pipeline stages place their CP groups differently: a stage's CP groups are "
            f"blocks of tp*cp = {f.tp}*{f.cp} = {block} consecutive ranks, which neither "
            f"divides nor is a multiple of {g} GPUs per node, so some stages' groups cross "
            f"nodes where stage 0's (what the attention runner measures) may not",
            f"a tp*cp that divides {g} or is a multiple of it")
