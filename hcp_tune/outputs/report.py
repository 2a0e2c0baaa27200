"""``report``: what a sweep measured, per key, as data for the HTML page.

Per sweep key (cluster, model, tp, cp, seq, runner, env_tag) and layout: the median of the
per-trial medians of its ok, verified trials, its peak memory (median over trials), every
measured step of those trials (the spread), and the cost model's prediction for the same
layout (``calibrate.fit_report``: the attention-layer model for ``runner=attention`` rows, the
training-step model for ``bridge``; calibrated parameters when stored for the cluster and
tag). The **Pareto front** is the set of layouts no other layout beats on both step time
and peak memory. Reads the stored rows only (a key folder at a time for every key); no
torch, no pandas.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hcp_tune.store.records import KEY_FIELDS, key_field
from hcp_tune.stats import verdict
from hcp_tune.engine.error_rates import rate_for
from hcp_tune.noise import percentile
from hcp_tune.outputs.regress import fingerprint_of, usable


@dataclass
class LayoutSummary:
    a2a: int
    p2p: int
    comm_type: str
    trials: int  # ok, verified trials
    median_s: float
    peak_mem_bytes: Optional[float]
    steps_s: list[float]
    predicted_s: Optional[float] = None
    pareto: bool = False
    # the 95% interval of median_s over the trials (engine/verdict.py)
    ci_lo_s: Optional[float] = None
    ci_hi_s: Optional[float] = None

    @property
    def label(self) -> str:
        return f"[{self.a2a},{self.p2p}]"


@dataclass
class KeySummary:
    key: dict[str, Any]
    layouts: list[LayoutSummary]
    not_ok: dict[str, int] = field(default_factory=dict)  # status -> count
    prediction_label: str = ""
    injected: int = 0  # trials that ran with HCP_TUNE_INJECT_DELAY
    verdict: str = ""  # settled | tie | unsettled, in words (verdict.summary)

    @property
    def name(self) -> str:
        return " ".join(f"{k}={self.key.get(k)}" for k in KEY_FIELDS
                        if k != "mix" or self.key.get(k))


def pareto(layouts: list[LayoutSummary]) -> None:
    """Mark the layouts no other layout beats on both time and memory. A layout whose
    memory was not measured (None: CPU trials) is never on the front and beats nothing."""
    known = [s for s in layouts if s.peak_mem_bytes is not None]
    for s in layouts:
        s.pareto = s.peak_mem_bytes is not None and not any(
            (o.median_s <= s.median_s and o.peak_mem_bytes <= s.peak_mem_bytes)
            and (o.median_s < s.median_s or o.peak_mem_bytes < s.peak_mem_bytes)
            for o in known if o is not s)


def _steps(row: dict[str, Any]) -> list[float]:
    raw = row.get("step_times_s") or "[]"
    try:
        vals = json.loads(raw) if isinstance(raw, str) else list(raw)
    except json.JSONDecodeError:
        return []
    return [float(v) for v in vals if isinstance(v, (int, float))]


def _predict(key: dict[str, Any], layouts: list[LayoutSummary], results_dir,
             profiles: Optional[dict[tuple[str, str], Any]] = None) -> str:
    """Fill ``predicted_s`` from the cost model; the label, or '' when it cannot predict.
    ``profiles``: (cluster, model) -> their profiles (None: they do not load), filled here:
    one report composes the Hydra config once per pair, not twice per key (~0.1-0.5 s a
    load, which made a report of thousands of keys take an hour)."""
    from hcp_tune.costmodel import calibrate
    from hcp_tune.costmodel.formulas import CostParams, label_for

    rows = [{**key, "a2a": s.a2a, "p2p": s.p2p, "median_s": s.median_s} for s in layouts]
    params = (calibrate.load_params(results_dir, key["cluster"], key["env_tag"])
              or CostParams())
    profiles = {} if profiles is None else profiles
    pair = (str(key["cluster"]), str(key["model"]))
    if pair not in profiles:
        from hcp_tune import config

        try:
            loaded = config.load([f"cluster={pair[0]}", f"model={pair[1]}"])
            profiles[pair] = (loaded.cluster, loaded.model)
        except (ValueError, KeyError, TypeError):  # an unknown profile: no prediction
            profiles[pair] = None
    if profiles[pair] is None:
        return ""
    cluster, model = profiles[pair]
    try:
        fitted = calibrate.fit_report(rows, params, clusters={pair[0]: cluster},
                                      models={pair[1]: model})
    except (ValueError, KeyError, TypeError):  # a layout the model cannot predict
        return ""
    for s, p in zip(layouts, fitted.per_row):
        s.predicted_s = p["predicted_s"]
    return label_for(cluster, params)


def summarize(rows: list[dict[str, Any]], *, results_dir=None, env_tag: Optional[str] = None,
              cluster: Optional[str] = None, model: Optional[str] = None,
              predictions: bool = True,
              profiles: Optional[dict[tuple[str, str], Any]] = None) -> list[KeySummary]:
    """Per key of ``rows`` (filtered by ``env_tag``, ``cluster``, ``model``), its layouts'
    statistics, in key order. ``profiles``: the (cluster, model) profiles loaded so far,
    shared by the calls of one report that summarises a key at a time."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if (env_tag and r.get("env_tag") != env_tag or cluster and r.get("cluster") != cluster
                or model and r.get("model") != model):
            continue
        groups.setdefault(tuple(key_field(r, k) for k in KEY_FIELDS), []).append(r)
    out = []
    if profiles is None:  # each (cluster, model) loaded once (``_predict``)
        profiles = {}
    for key, key_rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        by_layout: dict[int, list[dict[str, Any]]] = {}
        not_ok: dict[str, int] = {}
        for r in key_rows:
            if usable(r):
                by_layout.setdefault(int(r["a2a"]), []).append(r)
            else:
                not_ok[r.get("status", "?")] = not_ok.get(r.get("status", "?"), 0) + 1
        layouts = []
        for a2a, lrows in sorted(by_layout.items()):
            mems = [float(r["peak_mem_bytes"]) for r in lrows
                    if isinstance(r.get("peak_mem_bytes"), (int, float))
                    and not math.isnan(r["peak_mem_bytes"])]
            layouts.append(LayoutSummary(
                a2a=a2a, p2p=int(lrows[0]["p2p"]), comm_type=lrows[0].get("comm_type", ""),
                trials=len(lrows), median_s=percentile([float(r["median_s"]) for r in lrows], 50),
                peak_mem_bytes=percentile(mems, 50) if mems else None,
                steps_s=[t for r in lrows for t in _steps(r)]))
        pareto(layouts)
        decided = verdict.decide([r for lrows in by_layout.values() for r in lrows])
        intervals = {f.layout[0]: (f.ci_lo_s, f.ci_hi_s) for f in decided.figures}
        for s in layouts:
            s.ci_lo_s, s.ci_hi_s = intervals.get(s.a2a, (None, None))
        ks = KeySummary(dict(zip(KEY_FIELDS, key)), layouts, not_ok,
                        injected=sum(bool(fingerprint_of(r).get("inject_delay")) for r in key_rows),
                        verdict=(f"{verdict.summary(decided)} ({rate_for(decided.kind)})"
                                 if layouts else ""))
        if predictions and layouts:
            ks.prediction_label = _predict(ks.key, layouts, results_dir, profiles)
        out.append(ks)
    return out
