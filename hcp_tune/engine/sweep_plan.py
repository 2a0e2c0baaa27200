"""The sweep's plan, made in one place: ``plan_sweep(cfg, stored_rows, outstanding)``.

What belongs here: everything a sweep decides before it submits anything, from the config
(runner resolved), the stored rows and the trials still submitted: the sweep keys and their
kept layouts, the queue of planned trials in order (by prediction, repeats, resume,
``search.retry``), the layouts stored as skipped, the trials to re-attach, the counts the
summary reports, the notes, the fit advice and the cost estimate. Pure: no I/O, no
printing, no optuna; the cost model predicts each layout once and that one pass serves the
order, the skips, the costs and the fit advice (runner=bridge: a key whose every layout is
predicted not to fit is refused unless ``search.allow_predicted_oom``). ``sweep.Sweeper`` gathers the inputs,
applies the plan and does the I/O; ``ui.print_sweep_start`` prints it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.config.settings import RETRY_CHOICES
from hcp_tune.costmodel import predict
from hcp_tune.costmodel.formulas import CostParams
from hcp_tune.costmodel.microbatch import measure_points
from hcp_tune.costmodel.memory import advice_line
from hcp_tune.engine import budget, error_rates, sweep_adaptive
from hcp_tune.store.folder import SweepKey
from hcp_tune.store.folder import key_rows as select_rows
from hcp_tune.space.host_memory import plan_host_memory
from hcp_tune.space.layout import Candidate
from hcp_tune.space.plan import candidates, notes
from hcp_tune.space.plan import row as plan_row
from hcp_tune.spec import FailureClass, Status

if TYPE_CHECKING:
    from hcp_tune.store.studies import Outstanding

FAILURE_LABELS = RETRY_CHOICES[2:]  # every failure class, and "invalid"

LayoutId = tuple[int, int, int]  # (tp, seq, a2a): one layout of one key


def failure_label(row: dict[str, Any]) -> Optional[str]:
    """A stored trial that measured nothing usable: its failure class, or ``invalid``."""
    if row.get("status") == Status.FAILED.value:
        return row.get("failure_class") or FailureClass.UNKNOWN.value
    if row.get("status") == Status.INVALID.value:
        return "invalid"
    return None


def retry_labels(value: Any) -> frozenset[str]:
    """``search.retry``: which stored failures a sweep measures again.

    ``none`` (default): keep every stored outcome (cancelled trials and ``environment``
    failures are measured again regardless); ``failed``: every failed or invalid trial;
    a failure class (``oom``, ``comm``, ...) or ``invalid``, or a list of them. ``value``
    was checked at load (``settings.SearchConfig``).
    """
    items = ["none"] if value is None else value if isinstance(value, (list, tuple)) else [value]
    if "failed" in items:
        return frozenset(FAILURE_LABELS)
    return frozenset(i for i in items if i != "none")


def key_for(cfg: SweepConfig, cand: Candidate) -> SweepKey:
    """The sweep key a candidate layout is measured under."""
    return key_at(cfg, cand.tp, cand.seq)


def key_at(cfg: SweepConfig, tp: int, seq: int, runner: Optional[str] = None) -> SweepKey:
    """The sweep key of ``cfg`` at (tp, seq), for ``runner`` (default: the config's); pp and
    dp are the config's, as every candidate of it has them (``space.plan.candidates``)."""
    runner = runner or cfg.runner.name
    mix = cfg.mix_at(seq)
    return SweepKey(cluster=cfg.cluster.name, model=cfg.model.name, tp=tp, cp=cfg.cp, seq=seq,
                    runner=runner, env_tag=cfg.env_tag, pp=cfg.pp, dp=cfg.dp, mbs=cfg.mbs,
                    micro_batches=key_micro_batches(cfg, runner),
                    mix=mix.label if mix else "")


def key_micro_batches(cfg: SweepConfig, runner: Optional[str] = None) -> int:
    """The key's m: the user's gbs/(mbs*dp) for runner=bridge (what the step is ranked at);
    1 for the attention runner, which times one micro-batch whatever gbs says."""
    return cfg.micro_batches if (runner or cfg.runner.name) == "bridge" else 1


def kept_by_key(cfg: SweepConfig, cands: Optional[list[Candidate]] = None
                ) -> dict[SweepKey, list[Candidate]]:
    """Every key with a kept layout and its kept layouts, in candidate order (tp, seq, a2a)."""
    groups: dict[SweepKey, list[Candidate]] = {}
    for cand in candidates(cfg) if cands is None else cands:
        if cand.kept:
            groups.setdefault(key_for(cfg, cand), []).append(cand)
    return groups


@dataclass(frozen=True)
class Planned:
    """One trial to measure."""

    key: SweepKey
    cand: Candidate


@dataclass(frozen=True)
class Skip:
    """A layout stored as ``skipped``: predicted slower than ``search.skip_predicted_slower_than``
    times the best of its key."""

    key: SweepKey
    cand: Candidate
    reason: str
    predicted_step_s: float


@dataclass(frozen=True)
class Reattach:
    """A trial an earlier orchestrator submitted and nothing stored yet: followed by job id."""

    key: SweepKey
    cand: Candidate
    trial: "Outstanding"


@dataclass
class SweepPlan:
    """What a sweep will do, decided before it submits anything."""

    kept: dict[SweepKey, list[Candidate]]  # every key with a kept layout, its kept layouts
    queue: list[Planned]  # in submission order
    skipped: list[Skip]
    reattach: list[Reattach]
    stored: dict[SweepKey, list[dict[str, Any]]]  # each key's stored rows (by key fields)
    resumed: int  # stored trials that stand and are not measured again
    retried: int  # stored failures measured again because of search.retry
    # per key, by failure class (or "invalid"): stored failures kept that search.retry would redo
    kept_failures: dict[SweepKey, dict[str, int]]
    notes: list[str]  # the recipe followed, the pipeline-stage note
    fit_advice: list[str]  # per key where no layout is predicted to fit: what would
    costs: dict[LayoutId, budget.TrialCost]  # every kept layout's estimated cost
    estimate: budget.Estimate  # of the queue: exactly the planned trials
    cpu: bool = False  # a CPU profile: the estimate counts rank-hours
    retry: str = "none"  # search.retry as given
    # runner=bridge: (tp, seq) of the keys not queued because no layout is predicted to fit
    refused: list[tuple[int, int]] = field(default_factory=list)

    @property
    def keys(self) -> list[SweepKey]:
        return list(self.kept)

    @property
    def reattached(self) -> int:
        return len(self.reattach)

    @property
    def estimate_text(self) -> str:
        """The estimate in words, labelled an estimate (``budget.Estimate.text``)."""
        return self.estimate.text(self.cpu)


def _resume(key_rows: list[dict[str, Any]], retry: frozenset[str], repeats: int
            ) -> tuple[dict[int, int], dict[str, int], int]:
    """Per a2a size, the stored trials that count toward ``repeats`` (``repeats`` for a
    layout out of the running: ``sweep_adaptive``); the kept failures by label; how many
    stored failures are measured again. Cancelled trials and environment failures (fixed
    by the user, then resumed) are measured again, and so are the failures
    ``search.retry`` names; every other stored outcome stands. A kept failure is counted
    when its layout has nothing better stored, so the user hears of the option."""
    done: dict[int, int] = {}
    kept: dict[int, list[str]] = {}
    retried: dict[int, int] = {}
    for r in key_rows:  # trial ids sort in submission order
        label = failure_label(r)
        if r["status"] == Status.CANCELLED.value or label == FailureClass.ENVIRONMENT.value:
            continue
        if label in retry:
            retried[r["a2a"]] = retried.get(r["a2a"], 0) + 1
            continue
        done[r["a2a"]] = done.get(r["a2a"], 0) + 1
        if label:
            kept.setdefault(r["a2a"], []).append(label)
    standing = [r for r in key_rows if r["status"] != Status.CANCELLED.value
                and failure_label(r) not in (*retry, FailureClass.ENVIRONMENT.value)]
    out = sweep_adaptive.closed(standing, repeats)
    have = sweep_adaptive.usable_counts(standing)
    done = {a2a: repeats if a2a in out else have.get(a2a, 0) for a2a in done}
    counts: dict[str, int] = {}
    for a2a, labels in kept.items():
        usable = have.get(a2a, 0)
        for label in labels[len(labels) - max(0, min(len(labels), repeats - usable)):]:
            counts[label] = counts.get(label, 0) + 1
    n_retried = sum(min(n, max(0, repeats - done.get(a2a, 0))) for a2a, n in retried.items())
    return done, counts, n_retried


def plan_sweep(cfg: SweepConfig, stored_rows: list[dict[str, Any]],
               outstanding: dict[SweepKey, list["Outstanding"]], *,
               params: Optional[CostParams] = None,
               only: Optional[dict[tuple[int, int], set[int]]] = None) -> SweepPlan:
    """The sweep's plan (deterministic; no I/O).

    ``stored_rows``: ``ResultStore.rows()``; ``outstanding``: per key, the trials submitted
    and not stored (``LayoutStudy.outstanding``); ``params``: the cost model's parameters
    (``predict.params_for`` reads the calibrated ones; default the uncalibrated defaults);
    ``only``: (tp, seq) -> the a2a sizes to measure (the two-stage sweep's Bridge stage),
    other layouts are neither queued nor skipped.
    """
    s = cfg.search
    params = params or CostParams()
    cands = candidates(cfg)
    ordered = predict.ordering(cfg, cands, params=params)  # the one prediction pass
    predicted = {(c.tp, c.seq, c.layout.a2a): p.step_time_s for c, p in ordered}
    skips = {(k["tp"], k["seq"], k["a2a"]): k
             for k in predict.skip_slower_than(ordered, s.skip_predicted_slower_than)}
    costs = budget.costs_by_layout(cfg, ordered)
    unfit = predict.fit_advice(cfg, ordered, params)
    refused = refused_keys(cfg, unfit)
    advice = [advice_line(a, cfg.cluster.gpu_memory_gib, "sweep")
              + (REFUSED if (a["tp"], a["seq"]) in refused else "") for a in unfit]
    retry = retry_labels(s.retry)
    # search.adaptive: every layout gets min_repeats now; the sweep adds rounds for the
    # undecided ones as results come in (sweep_adaptive.next_round)
    target = budget.first_repeats(s)
    kept = kept_by_key(cfg, cands)
    queue: list[Planned] = []
    skipped: list[Skip] = []
    reattach: list[Reattach] = []
    stored: dict[SweepKey, list[dict[str, Any]]] = {}
    kept_failures: dict[SweepKey, dict[str, int]] = {}
    resumed = retried = 0
    for key, layouts in kept.items():
        key_rows = stored[key] = select_rows(stored_rows, key)
        if (key.tp, key.seq) in refused:  # nothing queued, re-attached, skipped or added
            kept[key] = []  # by an adaptive round: the advice line says why
            continue
        done, failures, n_retried = _resume(key_rows, retry, target)
        resumed += sum(1 for r in key_rows if r["status"] != Status.CANCELLED.value
                       and failure_label(r) not in (*retry, FailureClass.ENVIRONMENT.value))
        retried += n_retried
        if failures:
            kept_failures[key] = failures
        stored_ids = {r.get("trial_id") for r in key_rows}
        by_a2a = {c.layout.a2a: c for c in layouts}
        for o in outstanding.get(key, []):
            if o.trial_id in stored_ids or o.a2a not in by_a2a:
                continue  # stored meanwhile, or a layout this config no longer keeps
            reattach.append(Reattach(key, by_a2a[o.a2a], o))
            done[o.a2a] = done.get(o.a2a, 0) + 1
        if s.order_by_prediction:  # the promising layouts first: early stopping bites sooner
            layouts = sorted(layouts, key=lambda c: predicted.get((c.tp, c.seq, c.layout.a2a), 0.0))
        if only is not None:
            layouts = [c for c in layouts if c.layout.a2a in only.get((c.tp, c.seq), set())]
        for cand in layouts:
            skip = skips.get((cand.tp, cand.seq, cand.layout.a2a))
            if skip and not done.get(cand.layout.a2a):
                skipped.append(Skip(key, cand, skip["reason"], skip["predicted"]["step_time_s"]))
                done[cand.layout.a2a] = target
        for _ in range(target):  # a repeat is another trial, after every layout's first
            for cand in layouts:
                if done.get(cand.layout.a2a, 0) > 0:
                    done[cand.layout.a2a] -= 1
                    continue
                queue.append(Planned(key, cand))
    est = budget.estimate([costs[(p.cand.tp, p.cand.seq, p.cand.layout.a2a)] for p in queue])
    return SweepPlan(
        kept=kept, queue=queue, skipped=skipped, reattach=reattach, stored=stored,
        resumed=resumed, retried=retried, kept_failures=kept_failures,
        notes=sweep_notes(cfg, costs),
        fit_advice=advice, costs=costs, estimate=est, cpu=cfg.cluster.device == "cpu",
        retry=str(s.retry), refused=sorted(refused))


REFUSED = ("; runner=bridge queues none of its layouts (each would run its whole start-up, "
           "then fail as oom): apply that change, or set search.allow_predicted_oom=true to "
           "measure them anyway")


def refused_keys(cfg: SweepConfig, unfit: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """runner=bridge: the (tp, seq) keys whose every layout is predicted not to fit the
    GPU memory (``predict.fit_advice``), unless ``search.allow_predicted_oom``. A Bridge
    trial builds the whole model and its communicators before its first step, so an OOM
    costs minutes of every GPU of the world; the attention runner's trials are cheap and
    measure one layer, whose memory is not the model's, so it is never refused."""
    if cfg.runner.name != "bridge" or cfg.search.allow_predicted_oom:
        return set()
    return {(a["tp"], a["seq"]) for a in unfit}


def plan_rows(cfg: SweepConfig) -> dict[str, Any]:
    """What ``plan`` prints: every candidate kept or rejected and why, the notes and the
    budget estimate; the JSON-able form that both the table and ``format=json`` print, so the
    two can never disagree."""
    cands = candidates(cfg)
    return {
        "cluster": cfg.cluster.name,
        "model": cfg.model.name,
        "cp": cfg.cp,
        "pp": cfg.pp,
        "notes": sweep_notes(cfg, budget.costs_by_layout(cfg, predict.ordering(cfg, cands))),
        "candidates": [plan_row(c) for c in cands],
        "estimate": sweep_estimate(cfg, cands),
        "micro_batches": {"user": cfg.micro_batches,
                          "measured": list(measure_points(cfg.pp, cfg.micro_batches))}
        if cfg.runner.name == "bridge" else None,
        "host_memory": plan_host_memory(cfg),
    }


def sweep_notes(cfg: SweepConfig, costs: dict[LayoutId, budget.TrialCost]) -> list[str]:
    """The notes every command prints (``space.plan.notes``) and, for runner=bridge, the
    micro-batch counts a trial runs and what one trial costs (estimated, every run)."""
    out = notes(cfg)
    if cfg.runner.name != "bridge":
        return out
    user_m, ms = cfg.micro_batches, measure_points(cfg.pp, cfg.micro_batches)
    if len(ms) == 1:
        line = (f"runner=bridge measures each layout at the user's m={user_m} micro-batches "
                f"itself (m <= 3*pp={3 * cfg.pp}: nothing to extrapolate)")
    else:
        at = ", ".join(map(str, ms[:-1])) + f" and {ms[-1]}"
        line = (f"runner=bridge measures each layout by {len(ms)} Bridge runs, at m={at} "
                f"micro-batches (pp, 2*pp and 3*pp), fits step = a + b*m, checks it is a line"
                f" and ranks at the user's m={user_m}")
    memory = plan_host_memory(cfg)  # the loader's and processes' host memory, per rank
    if costs:
        secs = sorted(c.seconds for c in costs.values())
        c = max(costs.values(), key=lambda c: c.ranks)
        span = f"{secs[0]:.0f} s" if round(secs[0]) == round(secs[-1]) else (
            f"{secs[0]:.0f}-{secs[-1]:.0f} s")
        what = "processes" if cfg.cluster.device == "cpu" else "GPUs"
        line += (f"; one trial ({c.runs} run{'s' if c.runs > 1 else ''}) holds {c.ranks} "
                 f"{what} on {c.nodes} node(s) for about {span} (estimate)")
    return [*out, line] + ([memory["text"]] if memory else [])


def sweep_estimate(cfg: SweepConfig, cands: list[Candidate]) -> dict[str, Any]:
    """What measuring every kept layout ``budget.first_repeats`` times would cost (an
    estimate; an adaptive sweep adds trials only for undecided layouts)."""
    per = budget.costs_by_layout(cfg, predict.ordering(cfg, cands))
    costs = [c for c in per.values() for _ in range(budget.first_repeats(cfg.search))]
    est = budget.estimate(costs)
    cpu = cfg.cluster.device == "cpu"
    out = {"trials": est.trials, "node_hours": est.node_hours, "gpu_hours": est.gpu_hours,
           "label": "estimate", "text": est.text(cpu)}
    if cfg.search.adaptive and cfg.search.repeats > cfg.search.min_repeats and per:
        # the rounds that follow, for undecided layouts only: their most, and what the
        # decision-cost benchmark saw adaptive measure of it
        most = budget.estimate([c for c in per.values() for _ in range(cfg.search.repeats)])
        unit = "rank-hours" if cpu else "GPU-hours"
        out.update(max_trials=most.trials, max_gpu_hours=most.gpu_hours)
        out["text"] += (f"; then rounds for the undecided layouts only, up to {most.trials} "
                        f"trial(s) in all, {most.gpu_hours:.3g} {unit} (search.repeats="
                        f"{cfg.search.repeats} each); in the decision-cost benchmark adaptive "
                        f"sweeps measured {error_rates.ADAPTIVE_COST}")
    return out
