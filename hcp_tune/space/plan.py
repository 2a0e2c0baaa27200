"""``plan``: every candidate layout of the composed sweep, kept or rejected, and why.

Pure over the config: no torch, no jobs. ``engine.sweep_plan.plan_rows`` adds the budget
estimate and is the JSON-able form that both the table and ``format=json`` print.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hcp_tune.config import SweepConfig
from hcp_tune.packing import summarise
from hcp_tune.space.layout import Candidate, enumerate_layouts
from hcp_tune.upstream.rules import BY_ID, Facts, evaluate


def candidates(cfg: SweepConfig) -> list[Candidate]:
    """All candidates of the sweep, ordered by tp, seq, then a2a size.

    With ``search.a2a_sizes`` set, a layout whose a2a size is not listed is not kept, and
    says so (the too-close-to-call group's settling sweep measures only those listed)."""
    cands = [
        c
        for tp in cfg.tps
        for seq in cfg.seqs
        for c in enumerate_layouts(
            cfg.model,
            cfg.cluster,
            cp=cfg.cp,
            tp=tp,
            seq=seq,
            dp=cfg.dp,
            pp=cfg.pp,
            drop_cross_node_a2a=cfg.drop_cross_node_a2a,
            packed=cfg.data.packing == "thd",
        )
    ]
    only = cfg.search.a2a_sizes
    if only is None:
        return cands
    listed = f"search.a2a_sizes=[{','.join(map(str, only))}]"
    return [c if c.layout.a2a in only or not c.kept else
            dataclasses.replace(c, kept=False, reasons=(f"a2a={c.layout.a2a} is not in {listed}",))
            for c in cands]


def crossing(c: Candidate) -> str:
    """Which levels leave a node: 'a2a+p2p', 'a2a', 'p2p' or '-'."""
    g = c.groups
    levels = [n for n, x in (("a2a", g.a2a_crosses_nodes), ("p2p", g.p2p_crosses_nodes)) if x]
    return "+".join(levels) or "-"


def row(c: Candidate) -> dict[str, Any]:
    g = c.groups
    return {
        "tp": c.tp,
        "cp": c.cp,
        "seq": c.seq,
        "dp": c.dp,
        "pp": c.pp,
        "a2a": c.layout.a2a,
        "p2p": c.layout.p2p,
        "sizes": c.layout.sizes,
        "comm_type": c.layout.comm_type,
        "kept": c.kept,
        "reasons": list(c.reasons),
        "flags": list(c.flags),
        "findings": [vars(f) for f in c.findings],
        "world_size": g.world_size,
        "nodes": g.nodes,
        "crosses_nodes": crossing(c),
        "groups": g.as_dict(),
        "bridge_overrides": c.layout.bridge_overrides(),
    }


def stage_note(cfg: SweepConfig) -> str:
    """What one trial runs: the whole world for runner=bridge, one stage for the attention
    runner when the world has several pipeline stages."""
    if cfg.runner.name == "bridge":
        tp = max(cfg.tps)
        world = tp * cfg.cp * cfg.dp * cfg.pp
        per_node = cfg.cluster.gpus_per_node or world
        nodes = -(-world // per_node)
        return (f"runner=bridge trains the whole world per trial: tp*cp*dp*pp = {tp}*{cfg.cp}*"
                f"{cfg.dp}*{cfg.pp} = {world} GPUs on {nodes} node(s), mbs={cfg.mbs}, "
                f"m={cfg.micro_batches} micro-batches per step (gbs={cfg.gbs or cfg.mbs * cfg.dp});"
                f" a cheaper proxy is runner=attention (one stage's CP groups, tp*cp*dp GPUs), "
                f"which cannot see the pipeline bubble, the optimizer or the data-parallel "
                f"reduce-scatter/all-gather sharing links with the CP ring")
    if cfg.pp == 1:
        return ""
    return (f"pp={cfg.pp}: the world is tp*cp*dp*pp and every stage has its own CP groups "
            f"(ranks s*tp*cp*dp .. (s+1)*tp*cp*dp-1 for stage s); the attention runner "
            f"measures one stage's CP groups (world tp*cp*dp); runner=bridge trains the whole "
            f"world; the cost model predicts the whole pipeline")


def mix_notes(cfg: SweepConfig) -> list[str]:
    """data.packing=thd: per seq, the mix's label and summary (documents a sequence, attention
    work against one seq-long document, the 2*cp padding), then the per-document padding rule
    (``thd-doc-padding``, with this mix's overhead when one seq is planned)."""
    lines, overheads = [], []
    for seq, mix in cfg.mixes:
        s = summarise(mix, seq, cfg.cp)
        overheads.append(s.padding_overhead)
        lines.append(f"data.packing=thd, mix {mix.label} at seq={seq}: {s.line()}")
    facts = Facts(cp=cfg.cp, packed=bool(cfg.mixes),
                  pad_overhead=overheads[0] if len(overheads) == 1 else None)
    return lines + [f.text for f in evaluate(facts, (BY_ID["thd-doc-padding"],))]


def notes(cfg: SweepConfig) -> list[str]:
    """Lines every command prints above its table: the recipe followed, the stage note, the
    length mix's summary when documents are packed."""
    return [n for n in (cfg.recipe_note, stage_note(cfg)) if n] + mix_notes(cfg)
