"""Calibration: fit the cost model's free parameters to measured trials of one cluster and
environment tag, store them beside the results, and read them back for later predictions.

The fit is bounded robust least squares on log step time (soft-L1 of ``log predicted -
log measured``; ``robust_scale=None`` for plain squares) over the parameters in
``costmodel.FIT_FIELDS`` that the rows can inform: ``scipy.optimize.least_squares`` (trust
region reflective, imported only here, when a fit runs) on the logs of the parameters, each
within 1e4x of its start and below ``FIT_MAX`` (and ``FIT_MAX_GPU`` on GPUs), with a weak
pull towards the defaults so a parameter the rows cannot see stays where it was. A row measured by ``runner=attention``
(one attention layer, no GEMMs or optimizer) is compared with ``predict_attention_layer``,
forward only when it says ``"passes": "fwd"``; a ``runner=bridge`` row with ``predict``.
Rows with ``"compare": "within_key"`` (a published table whose rows are not comparable with
each other) count only through the ratios of one key's splits.

Stored as ``<results_dir>/calibration/<cluster>__<env_tag>.json``, with the band of the
fit's residuals (``costmodel.band``; in-sample, keys by tp, cp and seq).
    python -m hcp_tune.calibrate ROWS.json [results_dir=results]   (a JSON list or JSONL)
"""
from __future__ import annotations

import datetime
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.costmodel import band
from hcp_tune.costmodel.packed import mix_of_row, packed_work
from hcp_tune.costmodel.formulas import (
    FIT_FIELDS,
    FIT_MAX,
    FIT_MAX_GPU,
    FIT_START,
    CostParams,
    Prediction,
    predict,
    predict_attention_layer,
)
from hcp_tune.space.layout import Candidate, Layout, rank_groups
from hcp_tune.spec import atomic_write_text

BOUND_LOG = math.log(1e4)  # a fitted parameter stays within 1e4x of where it started
N_STARTS = 3  # fits from the defaults and from seeded perturbations of them (local minima)
ROBUST_SCALE = 0.1  # log error (~10%) beyond which a row's pull on the fit grows only linearly
UNDEFINED_LOG_ERROR = 50.0  # a point where the model has no finite time: as if e^50x off
PRIOR_WEIGHT = 1e-6  # pull (per squared log-ratio) towards the defaults: keeps unseen params put


@dataclass
class FitReport:
    """How well the (fitted) model reproduces measured rows: relative errors, pred/meas - 1."""

    n: int
    rms_rel_error: float
    max_rel_error: float
    per_row: list[dict[str, Any]] = field(default_factory=list)
    fitted: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "rms_rel_error": self.rms_rel_error,
                "max_rel_error": self.max_rel_error, "fitted": list(self.fitted),
                "per_row": self.per_row}


def _model_of(row: dict[str, Any]) -> ModelSpec | None:
    if "heads" not in row:
        return None
    heads, head_dim = int(row["heads"]), int(row["head_dim"])
    hidden = int(row.get("hidden") or heads * head_dim)
    return ModelSpec(
        name=str(row.get("model", "row")), layers=int(row.get("layers") or 1), hidden=hidden,
        ffn_hidden=int(row.get("ffn_hidden") or 4 * hidden), heads=heads,
        kv_heads=int(row.get("kv_heads") or heads), head_dim=head_dim,
        vocab=int(row.get("vocab") or 1),
    )


def _resolve(rows, clusters, models) -> list[tuple[ModelSpec, ClusterProfile, Candidate, dict]]:
    """Each row with its model spec, cluster profile and candidate (profiles by name via conf/)."""
    keys = {(r["cluster"], r.get("env_tag", "default")) for r in rows}
    if len(keys) != 1:
        raise ValueError(
            f"calibration fits one cluster and environment tag at a time, got {sorted(keys)}: "
            "filter the rows first")
    clusters, models = dict(clusters or {}), dict(models or {})
    out = []
    for r in rows:
        name, model = r["cluster"], _model_of(r)
        if model is None and r.get("model") not in models or name not in clusters:
            from hcp_tune import config  # Hydra: only when a profile must be read from conf/

            by_name = model is None and "model" in r  # dims in the row need no model file
            loaded = config.load([f"cluster={name}"] + ([f"model={r['model']}"] if by_name else []))
            clusters.setdefault(name, loaded.cluster)
            if by_name:
                models.setdefault(r["model"], loaded.model)
        model = model or models[r["model"]]
        cluster = clusters[name]
        layout = Layout(int(r["a2a"]), int(r["p2p"]))
        if "cp" in r and int(r["cp"]) != layout.cp:
            raise ValueError(f"row {r}: a2a*p2p = {layout.cp} != cp = {r['cp']}")
        tp = int(r.get("tp", 1))
        groups = rank_groups(layout, tp=tp, dp=1, gpus_per_node=cluster.gpus_per_node)
        out.append((model, cluster, Candidate(layout, tp, int(r["seq"]), 1, True, groups=groups), r))
    return out


PASSES = ("fwd+bwd", "fwd")  # a row's "passes": what was timed (published tables: often "fwd")


def predict_row(model: ModelSpec, cluster: ClusterProfile, cand: Candidate, row: dict,
                params: CostParams) -> Prediction:
    """The prediction a measured row is compared with: ``predict`` for a ``runner=bridge``
    row, else one attention layer, forward only when the row says ``passes: fwd``; a packed
    row (its ``mix``) on the documents its trials ran (``packed.mix_of_row``)."""
    passes = row.get("passes", "fwd+bwd")
    if passes not in PASSES:
        raise ValueError(f"row passes={passes!r}: expected one of {', '.join(PASSES)}")
    mbs = int(row.get("mbs", 1))
    mix = mix_of_row(row)
    kw = dict(mbs=mbs, dtype=row.get("dtype", "bf16"), params=params, packed=None if mix is None
              else packed_work(mix, cand.seq, cand.cp, cand.layout.a2a, mbs))
    if row.get("runner", "attention") == "bridge":
        if passes == "fwd":
            raise ValueError("row passes='fwd' with runner=bridge: a training step has a backward")
        return predict(model, cluster, cand, **kw)
    return predict_attention_layer(model, cluster, cand, forward_only=passes == "fwd", **kw)


def split_key(model: ModelSpec, cluster: ClusterProfile, cand: Candidate, row: dict) -> str:
    """The key whose rows are the splits of one problem (same dims, tp, cp, seq, passes)."""
    return (f"{cluster.name} seq={cand.seq} heads={model.heads}({model.kv_heads}) "
            f"d={model.head_dim} tp={cand.tp} cp={cand.cp} {row.get('passes', 'fwd+bwd')}")


def _errors(resolved, params: CostParams) -> list[float]:
    """log(predicted / measured) per row. Rows marked ``"compare": "within_key"`` (a table
    whose keys' absolute levels are not comparable, e.g. an uncertain sequence length) are
    centred on their key's mean: only the ratios between a key's splits count."""
    errs = [math.log(predict_row(model, cluster, cand, r, params).step_time_s / float(r["median_s"]))
            for model, cluster, cand, r in resolved]
    groups: dict[str, list[int]] = {}
    for i, (model, cluster, cand, r) in enumerate(resolved):
        if r.get("compare") == "within_key":
            groups.setdefault(split_key(model, cluster, cand, r), []).append(i)
    for idx in groups.values():
        mean = sum(errs[i] for i in idx) / len(idx)
        for i in idx:
            errs[i] -= mean
    return errs


def _free_fields(resolved) -> tuple[str, ...]:
    crosses = [c.groups.a2a_crosses_nodes or c.groups.p2p_crosses_nodes for _, _, c, _ in resolved]
    fields = list(FIT_FIELDS)
    if not any(crosses):
        fields.remove("inter_bw_efficiency")
    if all(crosses):
        fields.remove("intra_bw_efficiency")
    if any(cluster.peak_bf16_tflops is not None for _, cluster, _, _ in resolved):
        fields.remove("cpu_share_exponent")  # GPU rows: each rank has its own device
        fields.remove("large_block_tokens")  # flash kernels tile: long blocks cost nothing extra
    if all(r.get("compare") == "within_key" for _, _, _, r in resolved):
        # only ratios within a key count: scaling every time by k is invisible, so the
        # level (the compute efficiency) stays where it is and the rest is fitted around it
        fields.remove("compute_efficiency")
    rings = [(c.layout.p2p > 1, cl.hbm_bw_gbs is not None) for _, cl, c, _ in resolved]
    if not any(ring for ring, _ in rings):
        fields.remove("ring_step_overhead_us")
    if not any(ring and hbm for ring, hbm in rings):
        fields.remove("ring_merge_bytes_per_element")  # no ring, or no hbm_bw_gbs: no term
    if not any(c.layout.a2a > 1 for _, _, c, _ in resolved):
        fields.remove("small_message_half_bytes")
    return tuple(fields)


def fit_report(rows: list[dict], params: CostParams, *, clusters=None, models=None,
           fitted: tuple[str, ...] = ()) -> FitReport:
    """Relative errors of ``params`` on ``rows`` (no fitting)."""
    resolved = _resolve(rows, clusters, models)
    per_row = []
    for (model, cluster, cand, r), e in zip(resolved, _errors(resolved, params)):
        rel = math.exp(e) - 1.0
        per_row.append({"cp": cand.cp, "a2a": cand.layout.a2a, "p2p": cand.layout.p2p,
                        "tp": cand.tp, "seq": cand.seq, "mix": str(r.get("mix") or ""),
                        "measured_s": float(r["median_s"]),
                        "predicted_s": float(r["median_s"]) * math.exp(e), "rel_error": rel})
    rels = [abs(p["rel_error"]) for p in per_row]
    return FitReport(n=len(rels), rms_rel_error=math.sqrt(sum(x * x for x in rels) / len(rels)),
                     max_rel_error=max(rels), per_row=per_row, fitted=fitted)


def fit(rows: list[dict], *, clusters: dict[str, ClusterProfile] | None = None,
        models: dict[str, ModelSpec] | None = None,
        start: CostParams = CostParams(), n_starts: int = N_STARTS,
        robust_scale: float | None = ROBUST_SCALE) -> tuple[CostParams, FitReport]:
    """Fit the free parameters to ``rows`` (one cluster and env tag); returns them and the fit."""
    rows = [r for r in rows if r.get("median_s")]
    if not rows:
        raise ValueError("calibration needs at least one measured row with median_s")
    resolved = _resolve(rows, clusters, models)
    names = _free_fields(resolved)
    x0 = [math.log(getattr(start, n) or FIT_START.get(n, 1e-9)) for n in names]
    gpu = any(cluster.peak_bf16_tflops is not None for _, cluster, _, _ in resolved)
    limits = {**FIT_MAX, **(FIT_MAX_GPU if gpu else {})}
    upper = [math.log(limits[n]) if n in limits else math.inf for n in names]

    def params_at(x) -> CostParams:
        return start.replace(**{n: math.exp(min(float(v), hi)) for n, v, hi in zip(names, x, upper)})

    import numpy as np
    from scipy.optimize import least_squares

    lo = np.array([v - BOUND_LOG for v in x0])
    hi = np.array([min(v + BOUND_LOG, u) for v, u in zip(x0, upper)])
    lo = np.minimum(lo, hi - 1e-9)  # a start already above its cap may only come down
    prior = math.sqrt(PRIOR_WEIGHT)

    def residuals(x) -> np.ndarray:  # per row log(pred/meas), then the pull to the start
        try:
            errs = _errors(resolved, params_at(x))
        except (ZeroDivisionError, OverflowError, ValueError):  # a rate underflowed to 0 at
            errs = [UNDEFINED_LOG_ERROR] * len(resolved)        # the edge of the box: far off
        return np.array(errs + [prior * (a - b) for a, b in zip(x, x0)])

    robust = dict(loss="linear") if robust_scale is None else dict(loss="soft_l1",
                                                                   f_scale=robust_scale)
    rng = random.Random(0)  # a few seeded starts: the log-time surface has local minima
    starts = [x0] + [[v + rng.gauss(0.0, 1.5) for v in x0] for _ in range(n_starts - 1)]
    fits = [least_squares(residuals, np.clip(s, lo, hi), bounds=(lo, hi), method="trf",
                          x_scale="jac", xtol=1e-10, ftol=1e-10, gtol=1e-10, max_nfev=2000,
                          **robust) for s in starts]
    x = min(fits, key=lambda f: f.cost).x
    r0 = rows[0]
    when = datetime.date.today().isoformat()
    params = params_at(x).replace(
        source=f"calibrated {when} {r0['cluster']}/{r0.get('env_tag', 'default')} on {len(rows)} rows")
    return params, fit_report(rows, params, clusters=clusters, models=models, fitted=names)


def holdout_error(rows: list[dict], train_seqs, test_seqs, **kw) -> tuple[CostParams, FitReport, FitReport]:
    """Fit on rows whose seq is in ``train_seqs``; report on those in ``test_seqs``.

    Returns (params, train report, held-out report)."""
    train = [r for r in rows if int(r["seq"]) in set(train_seqs) and r.get("median_s")]
    test = [r for r in rows if int(r["seq"]) in set(test_seqs) and r.get("median_s")]
    if not train or not test:
        raise ValueError(f"holdout needs rows in both {sorted(train_seqs)=} and {sorted(test_seqs)=}")
    params, train_report = fit(train, **kw)
    for name in ("start", "n_starts", "robust_scale"):
        kw.pop(name, None)
    return params, train_report, fit_report(test, params, fitted=train_report.fitted, **kw)


def params_path(results_dir, cluster: str, env_tag: str) -> Path:
    """Where a calibration is stored. A name (what env_tag and profile names allow) is used
    as it is; anything else (a tag stored before tags had to be names) is percent-encoded,
    so a tag never becomes a path of its own ('a/b' -> 'a%2Fb')."""
    from urllib.parse import quote

    def part(text: str) -> str:
        return quote(text, safe="").replace("~", "%7E")

    return Path(results_dir) / "calibration" / f"{part(cluster)}__{part(env_tag)}.json"


def save_params(results_dir, cluster: str, env_tag: str, params: CostParams,
                fit_report: FitReport) -> Path:
    """Write the fitted parameters and the fit's error atomically; returns the path."""
    path = params_path(results_dir, cluster, env_tag)
    fit = {k: v for k, v in fit_report.as_dict().items() if k != "per_row"}
    fit["packed_rows"] = sum(1 for r in fit_report.per_row if r.get("mix"))  # packed.validated
    own = band.of_rows(fit_report.per_row, source="in-sample residuals of this calibration")
    if own is not None:  # predict uses it once it spans band.MIN_KEYS keys (costmodel.band)
        fit["band"] = own.as_dict()
    doc = {"cluster": cluster, "env_tag": env_tag, "params": params.as_dict(), "fit": fit}
    atomic_write_text(str(path), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def load_params(results_dir, cluster: str, env_tag: str) -> CostParams | None:
    """The calibrated parameters for this cluster and env tag, or None when never fitted."""
    path = params_path(results_dir, cluster, env_tag)
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return CostParams(**doc["params"])


SHIPPED_DIR = ("data", "calibrations")  # in hcp_tune/costmodel/: package data in the wheel


def shipped_names() -> list[str]:
    """The calibrations shipped with hcp-tune (what a profile's ``calibration:`` may name)."""
    from importlib import resources

    folder = resources.files("hcp_tune.costmodel").joinpath(*SHIPPED_DIR)
    return sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".json"))


def load_shipped(name: str) -> dict[str, Any]:
    """A shipped calibration's document (params, fit, band); ``ConfigError`` naming the
    valid names when there is none called ``name``."""
    from importlib import resources

    from hcp_tune.errors import ConfigError

    if name not in shipped_names():
        raise ConfigError(f"cluster.calibration={name!r}: no calibration of that name ships "
                          f"with hcp-tune; expected null or one of: {', '.join(shipped_names())}")
    path = resources.files("hcp_tune.costmodel").joinpath(*SHIPPED_DIR, f"{name}.json")
    return json.loads(path.read_text())


def read_rows(path: str) -> list[dict]:
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    files = [a for a in argv if "=" not in a]
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    if len(files) != 1 or set(opts) - {"results_dir"}:
        print("usage: python -m hcp_tune.calibrate ROWS.json [results_dir=results]", file=sys.stderr)
        return 2
    rows = read_rows(files[0])
    params, rep = fit(rows)
    path = save_params(opts.get("results_dir", "results"), rows[0]["cluster"],
                       rows[0].get("env_tag", "default"), params, rep)
    print(f"fitted {', '.join(rep.fitted)} on {rep.n} rows: rms relative error "
          f"{rep.rms_rel_error:.1%}, max {rep.max_rel_error:.1%}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
