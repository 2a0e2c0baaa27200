"""``predict``: the cost model's table for the composed sweep, and what sweeps take from it.

- ``predict_rows(cfg)``: JSON-able table, kept layouts best first within each (tp, seq)
  key, every number labelled predicted; rejected layouts with their reasons, no numbers.
- ``ordering(cfg)``: kept candidates with predictions, fastest first (sweeps measure the
  promising layouts first so early stopping bites sooner).
- ``skip_slower_than(ordered, factor)``: which to skip because they are predicted slower
  than the best of their key by more than ``factor`` (``search.skip_predicted_slower_than``).
- ``fit_advice(cfg, ordered, params)``: per key where no layout is predicted to fit, the
  smallest change that would (``memory.advice``).
- ``close_groups(cfg, rows, band)``: per (seq, tp) key, the layouts predicted to fit whose
  predicted time is within the model's band of the best (``costmodel.band``): too close to
  call, with the ``sweep`` command that measures exactly them (``settle_command``); for a
  key outside the band's domain (``band.domain_gaps``), every layout that fits.

Calibrated parameters for ``cfg.cluster``/``cfg.env_tag`` are used when stored; otherwise
the shipped calibration the cluster profile names (``calibration:``), otherwise the
defaults, and the label says which. No torch.

Packed keys (``data.packing=thd``): each layout is predicted on the documents its trials
run (``packed.packed_work``: ``cfg.mix_at(seq)`` packed for ``cfg.mbs`` sequences, as
``engine.trialspec`` draws them); its row carries the mix's figures under ``packed``, and
until a calibration fitted on packed rows is in use (``packed.validated``) its label says
"not validated on packed data" and its key gets no band (every layout that fits is to be
measured).
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

from hcp_tune.config import SweepConfig
from hcp_tune.costmodel import band, memory
from hcp_tune.costmodel.calibrate import load_params, load_shipped, params_path
from hcp_tune.costmodel.formulas import CostParams, Prediction, label_for, predict
from hcp_tune.costmodel.packed import NOT_VALIDATED, PackedWork, packed_work, validated
from hcp_tune.space.layout import Candidate
from hcp_tune.space.plan import candidates as plan_candidates
from hcp_tune.space.plan import crossing, notes


def params_for(cfg: SweepConfig) -> CostParams:
    """Your calibration for this cluster and env tag; else the shipped calibration the
    cluster profile names (``calibration:``); else the defaults."""
    own = load_params(cfg.results_dir, cfg.cluster.name, cfg.env_tag)
    if own or not cfg.cluster.calibration:
        return own or CostParams()
    return CostParams(**load_shipped(cfg.cluster.calibration)["params"])


def band_for(cfg: SweepConfig, params: CostParams) -> band.Band:
    """The band of the parameters in use: a calibration's own when it has enough keys, else
    the shipped band of the defaults for the cluster's hardware class (or pooled)."""
    shipped = band.shipped(cfg.cluster)
    if not params.calibrated:
        return shipped
    path = params_path(cfg.results_dir, cfg.cluster.name, cfg.env_tag)
    if not path.is_file() and cfg.cluster.calibration:  # the shipped one: its held-out band
        b = load_shipped(cfg.cluster.calibration)["band"]
        return band.Band(width=b["width_log"], q=b["q"], keys=b["keys"], pairs=b["pairs"],
                         source=f"held-out band of the shipped calibration "
                                f"{cfg.cluster.calibration} on {b['keys']} published keys")
    own = band.of_calibration(json.loads(path.read_text())) if path.is_file() else None
    return own or dataclasses.replace(
        shipped, source=f"{shipped.source}; the calibration has fewer than {band.MIN_KEYS} "
                        "keys for a band of its own")


def settle_command(cfg: SweepConfig, seq: int, tp: int, a2a_sizes: list[int]) -> str:
    """The ``sweep`` that measures exactly ``a2a_sizes`` for one (seq, tp) key of ``cfg``,
    with a measuring runner (runner=attention unless the config names one that measures)."""
    from hcp_tune.config import results_dir_override

    runner = cfg.runner.name if cfg.runner.name not in ("auto", "model") else "attention"
    args = [f"cluster={cfg.cluster.name}", f"model={cfg.model.name}", f"cp={cfg.cp}",
            f"seq={seq}", f"tp={tp}", f"pp={cfg.pp}", f"dp={cfg.dp}", f"mbs={cfg.mbs}",
            f"gbs={cfg.gbs}", f"dtype={cfg.dtype}", f"recompute={cfg.recompute.granularity}"]
    if cfg.recompute.granularity == "full":
        args.append(f"recompute_method={cfg.recompute.method}")
        if cfg.recompute.num_layers is not None:
            args.append(f"recompute_num_layers={cfg.recompute.num_layers}")
    if cfg.data.packing == "thd":  # the same documents: a packed key is its own key
        args += ["data.packing=thd", f"data.lengths={cfg.data.lengths}"]
    if cfg.env_tag != "default":
        args.append(f"env_tag={cfg.env_tag}")
    if results_dir_override(cfg):
        args.append(f"results_dir={results_dir_override(cfg)}")
    args += [f"runner={runner}", f"search.a2a_sizes=[{','.join(map(str, a2a_sizes))}]"]
    return "python -m hcp_tune sweep " + " ".join(shlex.quote(a) for a in args)


def packed_for(cfg: SweepConfig, c: Candidate) -> PackedWork | None:
    """The documents a packed key's trials run on this layout; None for fixed length."""
    mix = cfg.mix_at(c.seq)
    return None if mix is None else packed_work(mix, c.seq, c.cp, c.layout.a2a, cfg.mbs)


def packed_checked(cfg: SweepConfig, params: CostParams) -> bool:
    """Whether the parameters in use were fitted on packed rows (your calibration's file
    says so); the shipped calibrations and the defaults never were."""
    path = params_path(cfg.results_dir, cfg.cluster.name, cfg.env_tag)
    return params.calibrated and path.is_file() and validated(json.loads(path.read_text()))


def close_groups(cfg: SweepConfig, rows: list[dict[str, Any]], b: band.Band) -> list[dict]:
    """Per (seq, tp) key of ``predict_rows``' candidates with a layout predicted to fit: the
    too-close-to-call group (a2a sizes, predicted best first), whether it is a confident
    pick (a group of one) and, for a larger group, the command that measures only it."""
    keys: dict[tuple[int, int], dict[int, float]] = {}
    for r in rows:
        if r["fits_memory"]:
            keys.setdefault((r["seq"], r["tp"]), {})[r["a2a"]] = r["predicted_step_time_s"]
    out = []
    training = cfg.runner.name == "bridge" or cfg.pp > 1
    unchecked = {r["seq"] for r in rows if r.get("packed") and not r["packed"]["validated"]}
    for (seq, tp), times in keys.items():
        gaps = [] if b.own else band.domain_gaps(cfg.cluster, gpus=tp * cfg.cp * cfg.dp * cfg.pp,
                                                 training_step=training)
        if seq in unchecked:  # the band's keys, and a calibration's own, are fixed length
            gaps.append(f"packed data (mix {cfg.mix_at(seq).label})")
        # outside the band's domain: no band; every layout that fits is to be measured
        group = sorted(times, key=times.get) if gaps else band.close_group(times, b)
        out.append({"seq": seq, "tp": tp, "a2a_sizes": group,
                    "p2p_sizes": [cfg.cp // a for a in group],
                    "confident": len(group) == 1 and not gaps,
                    "not_validated": ", ".join(gaps),
                    "band_factor": b.factor,
                    "settle_command": settle_command(cfg, seq, tp, group) if len(group) > 1
                    or gaps else None})
    return out


def _key(c: Candidate) -> tuple[int, int]:
    return (c.seq, c.tp)


def ordering(cfg: SweepConfig, cands: list[Candidate] | None = None, *,
             params: CostParams | None = None) -> list[tuple[Candidate, Prediction]]:
    """Kept candidates with their predictions, by (seq, tp) key, fastest first in each key."""
    params = params or params_for(cfg)
    cands = plan_candidates(cfg) if cands is None else cands
    pairs = [(c, predict(cfg.model, cfg.cluster, c, mbs=cfg.mbs, dtype=cfg.dtype, params=params,
                         micro_batches=cfg.micro_batches, recompute=cfg.recompute,
                         packed=packed_for(cfg, c)))
             for c in cands if c.kept]
    return sorted(pairs, key=lambda cp: (_key(cp[0]), cp[1].step_time_s, cp[0].layout.a2a))


def _best_by_key(ordered) -> dict[tuple[int, int], float]:
    best: dict[tuple[int, int], float] = {}
    for c, p in ordered:
        best[_key(c)] = min(best.get(_key(c), p.step_time_s), p.step_time_s)
    return best


def skip_slower_than(ordered: list[tuple[Candidate, Prediction]],
                     factor: float | None) -> list[dict[str, Any]]:
    """Candidates predicted slower than ``factor`` x the best of their key (none if None).

    Each is a dict ready to be stored as a ``skipped`` row: layout, predicted numbers, reason.
    ``factor`` was checked at load (``search.skip_predicted_slower_than``: null or >= 1).
    """
    if factor is None:
        return []
    best = _best_by_key(ordered)
    out = []
    for c, p in ordered:
        ratio = p.step_time_s / best[_key(c)]
        if ratio > factor:
            out.append({
                "status": "skipped", "tp": c.tp, "cp": c.cp, "seq": c.seq,
                "a2a": c.layout.a2a, "p2p": c.layout.p2p, "predicted": p.as_dict(),
                "reason": f"predicted {ratio:.2f}x the best layout's step time "
                          f"({p.step_time_s:.3g} s vs {best[_key(c)]:.3g} s) > "
                          f"skip_predicted_slower_than={factor:g}",
            })
    return out


def fit_advice(cfg: SweepConfig, ordered: list[tuple[Candidate, Prediction]],
               params: CostParams) -> list[dict[str, Any]]:
    """Per (seq, tp) key where no layout of ``ordered`` is predicted to fit the GPU memory,
    the smallest change that would (``memory.advice``); reuses ``ordered``'s predictions."""
    gpu_mem = cfg.cluster.gpu_memory_gib
    unfit = sorted({_key(c) for c, _ in ordered}
                   - {_key(c) for c, p in ordered if p.memory_gib <= gpu_mem})
    return [memory.advice(dataclasses.replace(cfg, seqs=(seq,), tps=(tp,)), params)
            for seq, tp in unfit]


def _row(c: Candidate, p: Prediction, rank: int, best: float, gpu_mem: float) -> dict[str, Any]:
    return {
        "tp": c.tp, "cp": c.cp, "seq": c.seq, "dp": c.dp, "pp": c.pp, "a2a": c.layout.a2a,
        "p2p": c.layout.p2p, "sizes": c.layout.sizes, "comm_type": c.layout.comm_type,
        "rank": rank, "label": p.label, "predicted_step_time_s": p.step_time_s,
        "vs_best": p.step_time_s / best,
        "breakdown_s": {"compute_s": p.compute_s, "exposed_a2a_s": p.exposed_a2a_s,
                        "exposed_p2p_s": p.exposed_p2p_s, "other_s": p.other_s,
                        "recompute_s": p.recompute_s, "bubble_s": p.bubble_s,
                        "pp_send_s": p.pp_send_s},
        "terms_s": dataclasses.asdict(p.terms),  # the first three sums above, term by term
        "predicted_memory_gib": p.memory_gib,
        "memory_gib": {k: v for k, v in p.as_dict()["memory"].items()},
        "fits_memory": p.memory_gib <= gpu_mem, "flags": list(c.flags),
        "crosses_nodes": crossing(c),  # which level leaves a node, as plan says: a2a, p2p, -
        "bridge_overrides": c.layout.bridge_overrides(),
    }


def predict_rows(cfg: SweepConfig, *, params: CostParams | None = None) -> dict[str, Any]:
    """The ``predict`` table: every kept layout predicted, best first in each (seq, tp) key."""
    params = params or params_for(cfg)
    cands = plan_candidates(cfg)
    gpu_mem = cfg.cluster.gpu_memory_gib
    # layouts predicted not to fit come last in their key and get no rank: never recommended
    ordered = sorted(ordering(cfg, cands, params=params),
                     key=lambda cp: (_key(cp[0]), cp[1].memory_gib > gpu_mem))
    # vs_best against the fastest layout that fits (of all, in a key where none fits)
    best = {**_best_by_key(ordered),
            **_best_by_key([(c, p) for c, p in ordered if p.memory_gib <= gpu_mem])}
    checked = packed_checked(cfg, params) if cfg.mixes else False
    rows, rank, last = [], 0, None
    for c, p in ordered:
        rank = 1 if _key(c) != last else rank + 1
        last = _key(c)
        rows.append(_row(c, p, rank, best[_key(c)], gpu_mem))
        work = packed_for(cfg, c)
        if work is not None:
            rows[-1]["packed"] = work.as_dict(checked)
            if not checked:
                rows[-1]["label"] = f"{p.label}; packed {work.mix}: {NOT_VALIDATED}"
        if not rows[-1]["fits_memory"]:
            rows[-1]["rank"] = None
    advice = fit_advice(cfg, ordered, params)
    b = band_for(cfg, params)
    groups = close_groups(cfg, rows, b)
    for r in rows:
        g = next((g for g in groups if (g["seq"], g["tp"]) == (r["seq"], r["tp"])), None)
        r["too_close_to_call"] = bool(g) and r["a2a"] in g["a2a_sizes"] and not g["confident"]
    return {
        "label": label_for(cfg.cluster, params),
        "params_source": params.source,
        "params": params.as_dict(),
        "cluster": cfg.cluster.name, "model": cfg.model.name, "cp": cfg.cp, "pp": cfg.pp,
        "mbs": cfg.mbs, "gbs": cfg.gbs, "micro_batches": cfg.micro_batches,
        "recompute": cfg.recompute.granularity, "dtype": cfg.dtype, "env_tag": cfg.env_tag,
        "notes": notes(cfg),
        "gpu_memory_gib": cfg.cluster.gpu_memory_gib,
        "candidates": rows,
        "fit_advice": advice,  # per (seq, tp) key where nothing fits: the smallest change
        "band": b.as_dict(),  # the model's error on predicted ratios (costmodel.band)
        "close_groups": groups,  # per (seq, tp) key: the layouts the band cannot order
        "rejected": [{"tp": c.tp, "cp": c.cp, "seq": c.seq, "a2a": c.layout.a2a,
                      "p2p": c.layout.p2p, "sizes": c.layout.sizes, "reasons": list(c.reasons)}
                     for c in cands if not c.kept],
    }
