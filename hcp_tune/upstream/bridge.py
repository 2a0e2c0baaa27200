"""The HCP rules that restate Megatron-Bridge (``src/megatron/bridge/training/config.py``'s
validation, ``training/initialize.py``, ``scripts/training/run_recipe.py``): the per-layer
list, the sizes' product and presence, the decentralized process groups, which sequence
length runs, and the finetuning loss settings under CP. Each check returns (what was found,
the fix) or None.
"""
from __future__ import annotations

import math
from typing import Optional

from hcp_tune.upstream.facts import SIZES_KEY, Facts, sizes_fix


def comm_type_layers(f: Facts):
    if not f.per_layer or f.cp == 1 or f.num_layers is None:
        return None
    if len(f.comm_types) == f.num_layers:
        return None
    one = set(f.comm_types)
    fix = (f"model.cp_comm_type={next(iter(one))} (one value applies to every layer)"
           if len(one) == 1 else f"give model.cp_comm_type one entry per layer ({f.num_layers})")
    return (f"model.cp_comm_type has {len(f.comm_types)} entries but num_layers = "
            f"{f.num_layers}: Bridge and Megatron-Core assert one entry per layer", fix)


def silent_cp_off(f: Facts):
    if not f.hcp or f.sizes:
        return None
    return (f"model.cp_comm_type=a2a+p2p with context_parallel_size={f.cp} but no {SIZES_KEY}: "
            "Megatron-Core hands TE an empty hierarchical group, TE computes cp_size=1 and "
            f"each rank attends only to its own 1/{f.cp} of the sequence, with no error; it "
            "looks fast (Bridge #2667: >2x the GPU's peak TFLOP/s) and trains a wrong model. "
            "Bridge asserts the sizes are set whenever a layer uses a2a+p2p, at any CP size",
            sizes_fix(f))


def sizes_product(f: Facts):
    if not f.sizes or math.prod(f.sizes) == f.cp:
        return None
    arith = " * ".join(f"{n}({v})" for n, v in zip(("a2a", "p2p", "l2", "l3"), f.sizes))
    return (f"{SIZES_KEY}={list(f.sizes)}: {arith} = {math.prod(f.sizes)} != "
            f"context_parallel_size({f.cp})", sizes_fix(f))


def decentralized(f: Facts):
    if not f.decentralized_pg or not (f.hcp or f.sizes):
        return None
    return ("dist.use_decentralized_pg=true with hierarchical CP: Bridge raises "
            "NotImplementedError on the decentralized path when the sizes are set",
            "dist.use_decentralized_pg=false")


def seq_pair(f: Facts) -> bool:
    return None not in (f.model_seq, f.dataset_seq) and f.model_seq != f.dataset_seq


def seq_dataset_wins(f: Facts):
    if f.resolved or not seq_pair(f):
        return None
    return (f"model.seq_length={f.model_seq} but dataset.seq_length={f.dataset_seq}: "
            f"{f.dataset_seq} runs (Bridge's scripts/training/run_recipe.py copies the "
            "dataset's value into the model); launched any other way, Bridge asserts they match",
            f"model.seq_length={f.dataset_seq}")


def seq_mismatch(f: Facts):
    if not f.resolved or not seq_pair(f):
        return None
    return (f"model.seq_length={f.model_seq} != dataset.seq_length={f.dataset_seq} in a "
            "resolved config: ConfigContainer.validate asserts they match",
            f"model.seq_length={f.dataset_seq}")


def loss_settings(f: Facts) -> Optional[tuple[str, str]]:
    if not f.finetuning or f.cp == 1 or (f.per_token_loss and not f.average_in_collective):
        return None
    now = (f"model.calculate_per_token_loss={str(f.per_token_loss).lower()}, "
           f"ddp.average_in_collective={str(f.average_in_collective).lower()}")
    return now, "model.calculate_per_token_loss=true ddp.average_in_collective=false"


def finetune_runner(f: Facts):
    got = loss_settings(f)
    if got is None or f.resolved:
        return None
    return (f"finetuning with CP={f.cp} and {got[0]}: Bridge's run_recipe.py (>= 0.6, mode "
            "sft/lora/dora) sets calculate_per_token_loss=true and average_in_collective=false "
            "itself, and those run; launched any other way, ConfigContainer.validate asserts",
            got[1])


def finetune_cp_loss(f: Facts):
    got = loss_settings(f)
    if got is None or not f.resolved:
        return None
    return (f"finetuning with CP={f.cp} and {got[0]} in a resolved config: these values run "
            "and ConfigContainer.validate asserts (all-masked ranks would give NaN loss)", got[1])
