"""The cost model's own error, as a band on predicted ratios, and the too-close-to-call group.

What belongs here: the definition of the band, reading the shipped band (package data,
``costmodel/data/bands.json``, written by ``benchmarks/predicted_band.py``) and a
calibration's own, and the group of layouts a band cannot separate. Standard library only.

The band. For every key (one problem: cluster, model dims, tp, cp, seq) with held-out
predictions (made by parameters not fitted on that key: the uncalibrated defaults, or a
leave-one-key-out fit), let ``b`` be the predicted best layout. For every other layout
``j`` of the key, its error is ``max(0, log(pred_j/pred_b) - log(meas_j/meas_b))``: how much
the model overstates ``j``'s time relative to ``b`` (``best_pair_errors``). The band is the
``Q``-quantile (linear interpolation) of these errors over all such pairs of all keys. It is
a log ratio: a band of 0.05 means "predicted times within a factor exp(0.05) = 1.051 of the
best cannot be ordered". Why this pair error and not the symmetric one over every pair
(``pair_errors``, also reported): a measured best ``m`` is left out of the group only when
``log(pred_m/pred_b) > band``, and ``log(pred_m/pred_b) <= error(m)`` since ``meas_m <=
meas_b``; so the best is in the group whenever its own error is within the band. Errors
among slow layouts, or a model that understates how slow a layout is, never move the
best out and do not widen the band. A band per hardware class (``nvlink``, ``pcie``) is
used only when that class has at least ``MIN_KEYS`` keys; otherwise the pooled band, and
the source says so.

The group. Among the layouts predicted to fit in memory, those whose predicted time is
within ``exp(band)`` of the predicted best: the measured best lies among them unless its
pair error with the predicted best exceeds the band (the predicted best is the group's
first). A group of one is a confident pick.

The domain. The band was measured on keys of one kind (``DOMAIN``: 8x A100 NVLink, one
node, attention only); it says nothing of a key outside (``domain_gaps``: another GPU or
hardware class, a CPU profile, a key spanning nodes, a full training step). There the
group is every layout that fits, never a confident pick.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

Q = 0.9  # the band is this quantile of held-out pair errors (target: best in group >= 90-95%)
MIN_KEYS = 10  # a hardware class needs this many keys for its own band; else the pooled one
SHIPPED = "bands.json"  # in hcp_tune/costmodel/data/


@dataclass(frozen=True, kw_only=True)
class Band:
    """A width (log ratio) and where it came from."""

    width: float
    q: float = Q
    keys: int = 0
    pairs: int = 0
    source: str = ""
    own: bool = False  # a calibration's own band, from the user's cluster: not the shipped domain

    @property
    def factor(self) -> float:
        """exp(width): predicted times within this factor of the best are too close to call."""
        return math.exp(self.width)

    def as_dict(self) -> dict[str, Any]:
        return {"width_log": self.width, "factor": self.factor, "q": self.q, "keys": self.keys,
                "pairs": self.pairs, "source": self.source}


def pair_errors(measured: Iterable[float], predicted: Iterable[float]) -> list[float]:
    """``|log(p_i/p_j) - log(m_i/m_j)|`` for every pair ``i < j`` of one key's layouts."""
    m, p = list(measured), list(predicted)
    if len(m) != len(p):
        raise ValueError(f"pair_errors needs as many measured as predicted times, got "
                         f"{len(m)} and {len(p)}")
    d = [math.log(pi) - math.log(mi) for mi, pi in zip(m, p)]
    return [abs(d[i] - d[j]) for i in range(len(d)) for j in range(i + 1, len(d))]


def best_pair_errors(measured: Iterable[float], predicted: Iterable[float]) -> list[float]:
    """Per layout ``j`` other than the predicted best ``b``: ``max(0, log(p_j/p_b) -
    log(m_j/m_b))``, how much the model overstates ``j``'s time relative to ``b``."""
    m, p = list(measured), list(predicted)
    if len(m) != len(p):
        raise ValueError(f"best_pair_errors needs as many measured as predicted times, got "
                         f"{len(m)} and {len(p)}")
    b = min(range(len(p)), key=p.__getitem__)
    return [max(0.0, math.log(p[j] / p[b]) - math.log(m[j] / m[b]))
            for j in range(len(p)) if j != b]


def quantile(values: list[float], q: float) -> float:
    """The ``q``-quantile of ``values`` (linear interpolation between order statistics)."""
    if not values or not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile needs values and 0 <= q <= 1, got {len(values)} values, {q=}")
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def band_of(keys: list[tuple[list[float], list[float]]], *, q: float = Q,
            source: str = "") -> Band:
    """The band of held-out ``(measured, predicted)`` times, one pair of lists per key."""
    errs = [e for m, p in keys for e in best_pair_errors(m, p)]
    return Band(width=quantile(errs, q), q=q, keys=len(keys), pairs=len(errs), source=source)


def close_group(times: dict[int, float], band: Band) -> list[int]:
    """The a2a sizes whose predicted time is within ``band.factor`` of the fastest, fastest
    first (``times``: a2a size -> predicted seconds, the layouts predicted to fit)."""
    if not times:
        return []
    best = min(times.values())
    return [a for t, a in sorted((t, a) for a, t in times.items()) if t <= best * band.factor]


def measured_best(times: dict[int, float], noise_rel: float) -> set[int]:
    """The a2a sizes whose measured time is within the source's noise of the fastest: each
    counts as the best (a difference below the noise cannot be ordered by measuring)."""
    best = min(times.values())
    return {a for a, t in times.items() if t <= best * (1.0 + noise_rel)}


def hardware_class(cluster: Any) -> str:
    """``pcie`` when the profile caps a node's GPUs by a shared link, else ``nvlink``."""
    return "pcie" if getattr(cluster, "node_aggregate_bw_gbs", None) else "nvlink"


# Where the shipped band was checked (bands.json "domain", written by predicted_band.py):
# its keys' GPUs, hardware class, nodes and what was timed. A key outside it gets no band.
DOMAIN = {"gpus": ["A100"], "classes": ["nvlink"], "nodes": "single", "step": "attention",
          "what": "8x A100 NVLink, one node, attention only"}


def domain() -> dict[str, Any]:
    """The shipped band's domain (``DOMAIN`` unless bands.json records one)."""
    text = resources.files("hcp_tune.costmodel").joinpath("data", SHIPPED).read_text()
    return {**DOMAIN, **json.loads(text).get("domain", {})}


def domain_gaps(cluster: Any, *, gpus: int, training_step: bool,
                dom: dict[str, Any] | None = None) -> list[str]:
    """What puts a key outside the band's domain, in words (empty: inside). ``gpus``: the
    key's tp*cp*dp*pp; ``training_step``: a full step is predicted (runner=bridge, or pp >
    1), not the attention the band's keys timed."""
    dom = dom or domain()
    gaps = []
    name = str(getattr(cluster, "gpu_name", "") or "")
    if getattr(cluster, "device", "cuda") != "cuda":
        gaps.append("CPU profiles (the band's keys are GPUs)")
    elif name.split("-")[0] not in dom["gpus"]:
        gaps.append(f"{name or 'this GPU'}")
    if getattr(cluster, "device", "cuda") == "cuda" and hardware_class(cluster) not in dom["classes"]:
        gaps.append(f"{hardware_class(cluster)} nodes")
    per_node = int(getattr(cluster, "gpus_per_node", 0) or 0)
    if dom["nodes"] == "single" and per_node and gpus > per_node:
        gaps.append(f"cross-node keys ({gpus} GPUs > {per_node} per node)")
    if dom["step"] == "attention" and training_step:
        gaps.append("training steps")
    return gaps


def _band(doc: dict[str, Any], what: str) -> Band:
    return Band(width=float(doc["width_log"]), q=float(doc["q"]), keys=int(doc["keys"]),
                pairs=int(doc["pairs"]), source=what)


def shipped(cluster: Any, *, path: Path | None = None) -> Band:
    """The shipped band of the uncalibrated defaults for this cluster's hardware class, or
    the pooled band (with the reason) when the class has fewer than ``MIN_KEYS`` keys."""
    text = (path.read_text() if path is not None else
            resources.files("hcp_tune.costmodel").joinpath("data", SHIPPED).read_text())
    doc = json.loads(text)["defaults"]
    cls = hardware_class(cluster)
    own = doc.get("by_class", {}).get(cls)
    if own and own["keys"] >= MIN_KEYS:
        return _band(own, f"{cls} band of the defaults on {own['keys']} published keys")
    pooled = doc["pooled"]
    have = own["keys"] if own else 0
    return _band(pooled, f"pooled band of the defaults on {pooled['keys']} published keys "
                         f"({cls}: {have} keys < {MIN_KEYS}, too few for its own)")


def of_calibration(doc: dict[str, Any]) -> Band | None:
    """A stored calibration's own band (``fit.band``, from its rows' residuals), when it was
    fitted on at least ``MIN_KEYS`` keys; None otherwise (the shipped band is used)."""
    b = doc.get("fit", {}).get("band")
    if not b or b["keys"] < MIN_KEYS:
        return None
    return dataclasses.replace(
        _band(b, f"this calibration's band on {b['keys']} measured keys (in-sample)"), own=True)


def of_rows(per_row: list[dict[str, Any]], *, q: float = Q, source: str = "") -> Band | None:
    """The band of a fit report's rows (``calibrate.FitReport.per_row``: tp, cp, seq,
    measured_s, predicted_s), keys by (tp, cp, seq, mix); None without a key of two layouts."""
    keys: dict[tuple, tuple[list[float], list[float]]] = {}
    for r in per_row:
        m, p = keys.setdefault((r["tp"], r["cp"], r["seq"], r.get("mix", "")), ([], []))
        m.append(float(r["measured_s"]))
        p.append(float(r["predicted_s"]))
    usable = [k for k in keys.values() if len(k[0]) >= 2]
    return band_of(usable, q=q, source=source) if usable else None
