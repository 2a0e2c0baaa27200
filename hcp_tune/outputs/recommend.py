"""``recommend``: the best measured layout for a key, as paste-ready Bridge settings.

Reads ``recommendations.csv`` only; never measures. When nothing was measured for the key
it says so and lists the nearest keys that were.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from hcp_tune.engine.records import key_field
from hcp_tune.space.layout import Layout


def matches(rec: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(str(key_field(rec, k)) == str(v) for k, v in want.items() if v is not None)


def find(recs: list[dict[str, Any]], want: dict[str, Any]) -> list[dict[str, Any]]:
    """Recommendations for the key, most-measured first."""
    return sorted((r for r in recs if matches(r, want)), key=lambda r: -int(r["trials"]))


def nearest(recs: list[dict[str, Any]], want: dict[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """Measured keys closest to ``want``: same cluster and model first, then by how far
    cp, tp and seq are (in powers of two)."""
    def distance(r: dict[str, Any]) -> float:
        d = 0.0
        for k, weight in (("cluster", 100), ("model", 50)):
            d += weight * (str(r[k]) != str(want[k]))
        for k in ("cp", "tp", "pp", "seq"):
            if want.get(k):
                d += abs(math.log2(float(key_field(r, k) or 1) / float(want[k])))
        return d

    return sorted(recs, key=distance)[:n]


def bridge_overrides(rec: dict[str, Any]) -> list[str]:
    return Layout(int(rec["a2a"]), int(rec["p2p"])).bridge_overrides()


def python_form(rec: dict[str, Any]) -> list[str]:
    layout = Layout(int(rec["a2a"]), int(rec["p2p"]))
    lines = [f"cfg.model.context_parallel_size = {layout.cp}"]
    if layout.comm_type != "none":
        lines.append(f'cfg.model.cp_comm_type = "{layout.comm_type}"')
        sizes = layout.sizes if layout.comm_type == "a2a+p2p" else None
        lines.append(f"cfg.model.hierarchical_context_parallel_sizes = {sizes}")
    return lines


def key_text(r: dict[str, Any]) -> str:
    return (f"cluster={r['cluster']} model={r['model']} tp={r['tp']} pp={r.get('pp', 1)} "
            f"cp={r['cp']} seq={r['seq']}"
            f" env_tag={r.get('env_tag', '')}")


def answer(recs: list[dict[str, Any]], want: dict[str, Any]) -> tuple[Optional[dict], list[dict]]:
    """(the recommendation or None, the nearest measured keys when there is none)."""
    found = find(recs, want)
    if found:
        return found[0], []
    return None, nearest(recs, want)


def unfit_reason(rec: dict[str, Any], predicted: list[dict[str, Any]],
                 gpu_memory_gib: float) -> Optional[str]:
    """Why a measured best layout must not be recommended (it would run out of memory in
    training), or None. Measured: its peak (reserved or device-used) memory over the GPU's;
    predicted: the cost model's full-step memory of that layout over it."""
    peak = rec.get("peak_mem_bytes")
    if peak is not None and not (isinstance(peak, float) and math.isnan(peak)) \
            and float(peak) > gpu_memory_gib * 1024**3:
        return (f"[{rec['a2a']},{rec['p2p']}] measured {float(peak) / 1024**3:.1f} GiB peak "
                f"> {gpu_memory_gib:g} GiB per GPU")
    for r in predicted:
        if (r["a2a"], r["p2p"]) == (int(rec["a2a"]), int(rec["p2p"])) and not r["fits_memory"]:
            return (f"[{rec['a2a']},{rec['p2p']}] is predicted to need "
                    f"{r['predicted_memory_gib']:.1f} GiB per GPU in training > "
                    f"{gpu_memory_gib:g} GiB")
    return None
