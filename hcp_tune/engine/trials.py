"""One trial as the orchestrator sees it: the ``TrialSpec`` built for a kept layout
(``spec_for``), the result read back from its files (``read_result``: rank 0's, a peer's
root cause merged in), its live progress (``read_progress``), the early-stopping rule
(``should_prune``) and the result of a trial whose job ended without one
(``failed_from_job``, ``partial_result``). ``sweep.Sweeper`` and ``launch`` use them; no
optuna, no loop.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.engine import dispatch
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
PRUNE_FLOOR = 0.05  # a trial is never stopped for being less than 5% slower than the best


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
    median by more than the best's whole p10-p90 band (twice its ``noise.row_noise``), and
    at least 5%.

    Using the fastest step (not the median) makes the rule conservative: a trial with one
    slow outlier is never stopped, only one that is slow on every step.
    """
    if best is None or len(steps) < MIN_STEPS_TO_PRUNE:
        return False
    return min(steps) > best["median_s"] * (1 + max(PRUNE_FLOOR, 2 * row_noise(best)))


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
