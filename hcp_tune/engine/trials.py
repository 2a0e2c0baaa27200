"""One trial as the orchestrator sees it: the ``TrialSpec`` built for a kept layout
(``spec_for``), the result read back from its files (``read_result``: rank 0's, a peer's
root cause merged in), its live progress (``read_progress``), the early-stopping rule
(``should_prune``, with ``prune_reference`` for a run at another m than the best's median)
and the result of a trial whose job ended without one (``failed_from_job``,
``partial_result``). A runner=bridge trial is measured by three runs at m = pp, 2*pp and
3*pp micro-batches (``point_specs``), whose results become the trial's one result at the
user's m (``combine``) and its row's micro-batch fields (``point_fields``).
``sweep.Sweeper`` and ``launch`` use them; no optuna, no loop.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.costmodel.microbatch import Z90, StepFit, fit_step, measure_points, row_points
from hcp_tune.engine import dispatch
from hcp_tune.store.records import Verification
from hcp_tune.errors import ConfigError
from hcp_tune.merge import merge_root_cause
from hcp_tune.noise import row_noise
from hcp_tune.space.layout import Candidate
from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    TrialSpec,
    classify_error_text,
    fault_from_env,
    result_from_json,
)

MIN_STEPS_TO_PRUNE = 3  # measured steps a running trial needs before it can be judged
PRUNE_FLOOR = 0.10  # a trial is never stopped for being less than 10% slower than the best
PRUNE_Z = 3.0  # nor for less than 3 sd of the trial-to-trial spread (``between_sd``)


# a SLURM job that ended from outside (an administrator, preemption, a node lost): the trial
# did not fail, it was interrupted, and the next run measures it again
OUTSIDE_ENDINGS = frozenset({"CANCELLED", "PREEMPTED", "NODE_FAIL", "REQUEUED", "BOOT_FAIL",
                             "DEADLINE", "REVOKED"})


def spec_for(cfg: SweepConfig, cand: Candidate, trial_id: str, progress_dir: Path) -> TrialSpec:
    """The trial a candidate layout runs, with the ranks its groups must have; its result
    and stop files sit beside the progress folder, under ``<results_dir>/trials``."""
    r, m = cfg.runner, cfg.model
    trials_dir = progress_dir.parent / "trials"
    bridge = r.name == "bridge"
    # runner=bridge trains the whole world (tp*cp*dp*pp, every stage's groups); the attention
    # runner measures one pipeline stage (world tp*cp*dp, every replica's CP groups at once)
    groups = cand.groups if bridge and cand.groups is not None else cand.stage_groups(
        cfg.cluster.gpus_per_node)
    return TrialSpec(
        trial_id=trial_id, a2a=cand.layout.a2a, p2p=cand.layout.p2p, tp=cand.tp,
        dp=cand.dp, pp=cand.pp if bridge else 1, micro_batches=cfg.micro_batches if bridge else 0,
        seq=cand.seq, mbs=cfg.mbs, dtype="fp32" if cfg.cluster.device == "cpu" else cfg.dtype,
        heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim, hidden=m.hidden,
        ffn_hidden=m.ffn_hidden, layers=m.layers, vocab=m.vocab,
        runner=r.name, backend=r.backend, qkv_format=r.qkv_format, warmup_steps=r.warmup_steps,
        measure_steps=r.measure_steps, time_limit_s=r.time_limit_s,
        expected_groups=groups.as_dict(), peak_tflops=cfg.cluster.peak_bf16_tflops,
        device=cfg.cluster.device,
        progress_path=str(progress_dir / f"{trial_id}.jsonl"), env_tag=cfg.env_tag,
        result_path=str(trials_dir / f"{trial_id}.result.json"),
        stop_path=str(trials_dir / f"{trial_id}.stop"),
        bridge_recipe=r.recipe, bridge_overrides=list(r.overrides),
        inject_fault=_fault(cand.seq),  # tests only: HCP_TUNE_INJECT_FAULT
    )


def point_specs(spec: TrialSpec) -> list[TrialSpec]:
    """The runs one trial is measured by. runner=bridge with more micro-batches than it
    needs to extrapolate: one run per point of ``costmodel.microbatch.measure_points``
    (m = pp, 2*pp and 3*pp), each its own Bridge run with its id (``<trial>-m<m>``), result,
    progress file and micro-batch count, all stopped by the trial's one stop file; any
    other trial (the attention runner, or a Bridge trial at a small m): itself."""
    if spec.runner != "bridge":
        return [spec]
    ms = measure_points(spec.pp, max(1, spec.micro_batches))
    if len(ms) == 1:  # the user's m itself (measure_points): measured as it is
        return [spec]
    out = []
    for m in ms:
        tid = f"{spec.trial_id}-m{m}"
        out.append(dataclasses.replace(
            spec, trial_id=tid, micro_batches=m,
            progress_path=_beside(spec.progress_path, spec.trial_id, tid),
            result_path=_beside(spec.result_path, spec.trial_id, tid)))
    return out


def _beside(path: Optional[str], old: str, new: str) -> Optional[str]:
    if not path:
        return path
    p = Path(path)
    return str(p.with_name(p.name.replace(old, new, 1)))


def _fault(seq: int) -> Optional[str]:
    try:
        return fault_from_env(seq)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def read_result(spec: TrialSpec) -> Optional[TrialResult]:
    """The result a batch job wrote for this trial (rank 0's, with a peer's root cause
    merged in: ``merge_root_cause``), or None while there is none."""
    if not spec.result_path:
        return None
    try:
        res = result_from_json(Path(spec.result_path).read_text())
    except (OSError, ValueError):
        return None  # not written yet (the write itself is atomic)
    return merge_root_cause(res, Path(spec.result_path), spec.world_size)


def combine(spec: TrialSpec, points: list[TrialSpec],
            results: list[Optional[TrialResult]]) -> Optional[TrialResult]:
    """The trial's result from its runs' (``point_specs``, in order), or None while it is
    undecided (a run without a result yet, or one its job did not run: ``skipped``).

    One run: its result, as it is. Several: the first run that did not end ok decides
    (its status, class and steps; its error says at which m; no median, as its steps are
    not at the user's m), so a trial is ok only when every run is. All ok: the step at the
    user's m from the fit ``step = a + b*m`` through the runs' medians
    (``costmodel.microbatch.fit_step``) is the trial's median; a fit the third point
    shows is not a line (``StepFit.linearity``) or whose step does not grow with m is
    ``invalid``; its step times are the largest m's, scaled to that step, and p10/p90 are
    that spread widened by the fit's uncertainty at the user's m (``widened_band``); peak
    memory is the largest over the runs (at m >= pp, 1F1B's min(pp, m) micro-batches in
    flight make it the full run's); wall and phase seconds add up."""
    if len(points) == 1:
        res = results[0]
        return None if res is None or res.status is Status.SKIPPED else res
    for point, res in zip(points, results):
        if res is None or res.status is Status.SKIPPED:
            return None
        if res.status is not Status.OK:
            # its steps are kept; no median: a step at m=pp is not one at the user's m
            return dataclasses.replace(
                res, trial_id=spec.trial_id, world_size=spec.world_size, median_s=None,
                p10_s=None, p90_s=None,
                error=f"at m={point.micro_batches}: {res.error or res.status.value}")
    done = [r for r in results if r is not None]
    if any(r.median_s is None for r in done):
        return TrialResult(trial_id=spec.trial_id, status=Status.FAILED,
                           failure_class=FailureClass.UNKNOWN, world_size=spec.world_size,
                           error="a run ended ok without a median step time")
    fit = points_fit(points, done)
    user_m = max(1, spec.micro_batches)
    top, top_m = done[-1], points[-1].micro_batches
    ms = ", ".join(str(p.micro_batches) for p in points)
    not_linear = fit.linearity()
    if not_linear:
        return TrialResult(
            trial_id=spec.trial_id, status=Status.INVALID, world_size=spec.world_size,
            verification=top.verification, fingerprint=top.fingerprint,
            notes=[f"fit: {json.dumps(fit.as_dict(user_m))}"],
            error=(f"{not_linear}: the step at the user's m={user_m} cannot be extrapolated; "
                   "measure again (a repeat that is linear is ranked)"))
    if fit.per_micro_batch_s <= 0:
        return TrialResult(
            trial_id=spec.trial_id, status=Status.INVALID, world_size=spec.world_size,
            verification=top.verification, fingerprint=top.fingerprint,
            error=(f"the step did not grow with the micro-batches (m={ms}: "
                   + ", ".join(f"{r.median_s:.4g} s" for r in done)
                   + "): step = a + b*m cannot be fitted; measure again"))
    step = fit.step_s(user_m)
    scale = step / top.median_s
    p10, p90 = widened_band(step, fit.se_at(user_m),
                            top.p10_s * scale if top.p10_s is not None else None,
                            top.p90_s * scale if top.p90_s is not None else None)
    mems = [r.peak_mem_bytes for r in done if r.peak_mem_bytes is not None]
    phases: dict[str, float] = {}
    for r in done:
        for k, v in r.phases_s.items():
            phases[k] = phases.get(k, 0.0) + v
    unproven = [r.verification for r in done if not Verification.from_dict(r.verification).verified]
    flops = top.flops_per_gpu_step / top_m * user_m if top.flops_per_gpu_step else None
    notes = list(dict.fromkeys(n for r in done for n in r.notes))
    notes.append(f"measured at m={ms} micro-batches; the step at the user's m={user_m} is "
                 f"the fit {fit.fixed_s:.4g} s + {fit.per_micro_batch_s:.4g} s * m "
                 f"(standard error {fit.se_at(user_m):.3g} s, in p10/p90)")
    return TrialResult(
        trial_id=spec.trial_id, status=Status.OK, world_size=spec.world_size,
        step_times_s=[t * scale for t in top.step_times_s], median_s=step,
        p10_s=p10, p90_s=p90,
        peak_mem_bytes=max(mems) if mems else None,
        mem_note=(f"{top.mem_note}; the largest over m={ms}" if top.mem_note and mems
                  else top.mem_note),
        flops_per_gpu_step=flops,
        tflops_per_gpu=flops / step / 1e12 if flops else top.tflops_per_gpu,
        verification=unproven[0] if unproven else top.verification,
        fingerprint=top.fingerprint, backend=top.backend, te_backend=top.te_backend,
        qkv_format=top.qkv_format, notes=notes, resources=top.resources,
        log_path=top.log_path, job_id=top.job_id,
        wall_s=sum(r.wall_s for r in done if r.wall_s is not None) or None, phases_s=phases)


def points_fit(points: list[TrialSpec], results: list[TrialResult]) -> StepFit:
    """The fit ``step = a + b*m`` through a trial's runs: their medians at their m, each
    with its noise from its measured steps (``costmodel.microbatch.fit_step``)."""
    return fit_step(((p.micro_batches, r.median_s) for p, r in zip(points, results)),
                    steps=[r.step_times_s for r in results])


def widened_band(step: float, se: float, p10: Optional[float], p90: Optional[float]
                 ) -> tuple[Optional[float], Optional[float]]:
    """p10/p90 of the step at the user's m: the measured step-to-step spread (scaled to the
    step) and the fit's uncertainty ``se``, independent, added in quadrature on each side
    (``Z90 * se``: the fit's own p10/p90)."""
    if p10 is None or p90 is None:
        return p10, p90
    lo, hi = step - p10, p90 - step
    z = Z90 * se
    return step - math.hypot(lo, z), step + math.hypot(hi, z)


def point_fields(spec: TrialSpec, points: list[TrialSpec],
                 results: list[Optional[TrialResult]]) -> Optional[dict[str, Any]]:
    """A row's micro-batch fields (``records.TrialRow``) for a trial measured by several
    runs: the m of each run that has a result, their medians, and (every run ok) the fit
    and the step at the user's m. None for a trial of one run (``store.trial_row`` fills
    them from its spec)."""
    if len(points) == 1:
        return None
    ran = [(p.micro_batches, r) for p, r in zip(points, results)
           if r is not None and r.status is not Status.SKIPPED]
    out: dict[str, Any] = {"measured_micro_batches": json.dumps([m for m, _ in ran]),
                           "point_medians_s": json.dumps([r.median_s for _, r in ran])}
    if len(ran) == len(points) and all(r.status is Status.OK and r.median_s for _, r in ran):
        fit = points_fit(points, [r for _, r in ran])
        user_m = max(1, spec.micro_batches)
        worst = max(zip(fit.residuals_s(), fit.residual_sd_s()), key=lambda x: abs(x[0]))
        out.update(fixed_s=fit.fixed_s, per_micro_batch_s=fit.per_micro_batch_s,
                   step_at_user_m_s=fit.step_s(user_m), fit_se_s=fit.se_at(user_m),
                   fit_residual_s=worst[0], fit_residual_sd_s=worst[1])
    return out


def running_point(points: list[TrialSpec], results: list[Optional[TrialResult]]) -> TrialSpec:
    """The run of a trial measuring now (the first without a result; the last when all
    have one)."""
    return next((p for p, r in zip(points, results) if r is None), points[-1])


def prune_reference(best: Optional[dict[str, Any]], m: Optional[int],
                    user_m: Optional[int] = None) -> Optional[dict[str, Any]]:
    """What a run at ``m`` micro-batches is compared with for early stopping: the best
    row's median at that m (``point_medians_s``; the row itself when its median is the
    step at that m), with the best's relative p10-p90 band; the best row as it is for the
    attention runner (``m`` None) and for a row stored without its m, run at the key's
    (``user_m``); None when the best has no step at that m (a run at m = pp is never
    compared with a step at the user's m)."""
    if best is None or m is None:
        return best
    at = dict(row_points(best))
    if not at:
        return best if m == user_m else None
    if m not in at:
        return None
    median = best.get("median_s")
    if median == at[m]:
        return best
    ref: dict[str, Any] = {"median_s": at[m]}
    if isinstance(median, (int, float)) and median > 0:
        for k in ("p10_s", "p90_s"):
            if isinstance(best.get(k), (int, float)):
                ref[k] = best[k] / median * at[m]
    return ref


def read_progress(path: Optional[str]) -> list[float]:
    """Measured step times a running trial has written so far.

    The job appends one JSON line per measured step (``{"step": i, "time_s": t}``,
    ``hcp_tune.job.progress.record_step``); warm-up steps are never written.
    """
    if not path or not Path(path).exists():
        return []
    times = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written right now
        if "time_s" in rec:
            times.append(float(rec["time_s"]))
    return times


def should_prune(steps: list[float], best: Optional[dict[str, Any]]) -> bool:
    """Stop a trial when even its fastest measured step is slower than the best layout's
    median by more than each of: 10%, the best's whole p10-p90 band (twice its
    ``noise.row_noise``) and 3 sd of the trial-to-trial spread of the key's trials
    (``between_sd`` in the reference, the best figure's moderated spread of log trial
    medians, when some layout has 2 trials or more).

    One trial's steps share one allocation, so its band says nothing of how the next trial
    of the same layout lands: the 10% floor and the between-trial term keep a truly best
    layout whose first trial came out slow from being stopped (its verdict never counts a
    stopped layout as slower: ``verdict.decide``). The fastest step (not the median) makes
    the rule conservative: a trial with one slow outlier is never stopped.
    """
    if best is None or len(steps) < MIN_STEPS_TO_PRUNE:
        return False
    between = math.expm1(PRUNE_Z * float(best.get("between_sd") or 0.0))
    return min(steps) > best["median_s"] * (1 + max(PRUNE_FLOOR, 2 * row_noise(best), between))


def partial_result(spec: TrialSpec, status: Status, steps: list[float], error: str) -> TrialResult:
    res = TrialResult(trial_id=spec.trial_id, status=status, error=error, step_times_s=steps)
    if steps:
        res.median_s = statistics.median(steps)
    return res


def failed_from_job(spec: TrialSpec, outcome: dispatch.JobOutcome) -> TrialResult:
    """A job that ended without a trial result (killed, timed out, crashed on start).

    Ended from outside (scancel, preemption, a node lost, a requeue): ``cancelled``, which
    the next run measures again; otherwise ``failed`` with SLURM's verdict or the error."""
    sched = (outcome.scheduler_state or "").upper()
    if outcome.state == dispatch.JobState.CANCELLED or sched in OUTSIDE_ENDINGS:
        res = partial_result(spec, Status.CANCELLED, read_progress(spec.progress_path),
                             f"job ended from outside the sweep ({sched or 'cancelled'}); "
                             "measured again on the next run")
        res.log_path = str(outcome.stderr) if outcome.stderr else None
        return res
    # SLURM's own verdicts first; otherwise the error text, read as the job side reads it
    cls = {"TIMEOUT": FailureClass.TIME_LIMIT, "OUT_OF_MEMORY": FailureClass.OOM}.get(
        sched) or classify_error_text(outcome.error or "")
    if sched.startswith(dispatch.UNSCHEDULABLE):  # no trial of this shape can ever start here
        cls = FailureClass.ENVIRONMENT
    res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, failure_class=cls,
                      error=outcome.error or f"job ended: {outcome.scheduler_state or 'unknown'}")
    res.log_path = str(outcome.stderr) if outcome.stderr else None
    return res
