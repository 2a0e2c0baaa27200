"""Memory fit: which layouts fit the profile's GPU memory, and when none does, the smallest
change that would (activation recompute, or a larger tp, pp or cp), with its predicted
memory and the Bridge overrides that make it.

"Smallest" is: no more GPUs before more GPUs (recompute first, in the order selective,
full), then the fewest GPUs, then the fastest predicted step. Each change is tried on the
cost model alone (no torch, no files), and only changes the HCP rules accept count: tp
must divide the heads and stay inside a node, pp must divide the layers, cp the sequence.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hcp_tune.config import SweepConfig
from hcp_tune.costmodel.formulas import CostParams, predict
from hcp_tune.space.plan import candidates
from hcp_tune.upstream.pipeline import Recompute

RECOMPUTES = (Recompute("selective"), Recompute("full", "uniform", 1))
FACTORS = (2, 4, 8)  # how far tp, pp or cp may grow


def _best(cfg: SweepConfig, params: CostParams) -> tuple[Any, Any] | None:
    """The fastest kept layout that fits, with its prediction, or None."""
    fits = []
    for c in candidates(cfg):
        if not c.kept:
            continue
        p = predict(cfg.model, cfg.cluster, c, mbs=cfg.mbs, dtype=cfg.dtype, params=params,
                    micro_batches=cfg.micro_batches, recompute=cfg.recompute)
        if p.memory_gib <= cfg.cluster.gpu_memory_gib:
            fits.append((p.step_time_s, c.layout.a2a, c, p))
    return min(fits, key=lambda f: f[:2])[2:] if fits else None


def _changes(cfg: SweepConfig) -> list[tuple[str, SweepConfig]]:
    """Each single change worth trying, as (what the user types, the changed config)."""
    tp, seq, m = cfg.tps[0], cfg.seqs[0], cfg.model
    out = []
    if cfg.recompute.granularity == "none":
        for rc in RECOMPUTES:
            text = f"recompute={rc.granularity}" + (
                f" recompute_method={rc.method} recompute_num_layers={rc.num_layers}"
                if rc.granularity == "full" else "")
            out.append((text, dataclasses.replace(cfg, recompute=rc)))
    for k in FACTORS:
        if m.heads % (tp * k) == 0 and m.kv_heads % (tp * k) == 0 \
                and tp * k <= cfg.cluster.gpus_per_node:
            out.append((f"tp={tp * k}", dataclasses.replace(cfg, tps=(tp * k,))))
        if m.layers % (cfg.pp * k) == 0:
            out.append((f"pp={cfg.pp * k}", dataclasses.replace(cfg, pp=cfg.pp * k)))
        if seq % (2 * cfg.cp * k) == 0:
            out.append((f"cp={cfg.cp * k}", dataclasses.replace(cfg, cp=cfg.cp * k)))
    return out


def advice(cfg: SweepConfig, params: CostParams) -> dict[str, Any]:
    """The smallest change that makes a layout of ``cfg`` (one tp, one seq) fit; ``change``
    is None when nothing tried fits either."""
    tried = []
    for text, changed in _changes(cfg):
        found = _best(changed, params)
        if found is None:
            continue
        c, p = found
        world = c.tp * c.cp * c.dp * c.pp
        extra = changed.recompute.granularity != "none"
        tried.append(((world, p.step_time_s, extra), text, changed, c, p))
    if not tried:
        return {"tp": cfg.tps[0], "seq": cfg.seqs[0], "change": None}
    _, text, changed, c, p = min(tried, key=lambda t: t[0])
    return {
        "tp": cfg.tps[0], "seq": cfg.seqs[0], "change": text, "world_size": c.tp * c.cp * c.dp * c.pp,
        "layout": c.layout.sizes, "comm_type": c.layout.comm_type,
        "predicted_memory_gib": p.memory_gib, "predicted_step_time_s": p.step_time_s,
        "bridge_overrides": [f"model.tensor_model_parallel_size={c.tp}",
                             f"model.pipeline_model_parallel_size={c.pp}",
                             *(["model.sequence_parallel=true"] if c.tp > 1 else []),
                             *changed.recompute.bridge_overrides(),
                             *c.layout.bridge_overrides()],
    }


def advice_line(a: dict[str, Any], gpu_memory_gib: float, where: str) -> str:
    """One line for the user: nothing fits here, and what would."""
    head = f"no layout of tp={a['tp']} seq={a['seq']} is predicted to fit {gpu_memory_gib:g} GiB"
    if a["change"] is None:
        return f"{where}: {head}, and no single change of recompute, tp, pp or cp tried fits"
    return (f"{where}: {head}; smallest change that fits: {a['change']} (world "
            f"{a['world_size']} GPUs, [{a['layout'][0]},{a['layout'][1]}] "
            f"{a['predicted_memory_gib']:.1f} GiB predicted): {' '.join(a['bridge_overrides'])}")
