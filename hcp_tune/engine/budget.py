"""What a sweep will cost before it is spent: trials, node-hours and GPU-hours, estimated.

What belongs here: the estimate of one trial's wall time and resources from the cost
model's prediction (``costmodel.Prediction``) and the runner's steps, the sum over planned
trials, and its one-line wording. ``plan`` prints it, the sweep's first line states it,
and ``search.budget_gpu_hours`` stops submitting once the estimate of what was submitted
would pass it. Every number is an estimate and says so; on a CPU profile a "GPU-hour" is a
rank-hour (one process for an hour). No torch, no optuna: ``plan`` imports this.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hcp_tune.costmodel.microbatch import measure_points

# A job's own start-up, queue wait aside: the container, torch and Megatron-Core imports,
# the world group. ~10-30 s measured on this project's CPU machine; a GPU node starting a
# container takes longer, so the estimate takes the upper end. A batch of N trials pays it once.
JOB_START_S = 30.0
# The numerics proof (once per layout per process set) and the groups: a few short steps.
PROOF_STEPS = 2.0


@dataclass(frozen=True)
class TrialCost:
    """One planned trial's estimated wall time and what it holds for that time."""

    seconds: float
    ranks: int  # GPUs (on a CPU profile, processes)
    nodes: int
    runs: int = 1  # runner=bridge: one Bridge run per measured micro-batch count

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.ranks / 3600

    @property
    def node_hours(self) -> float:
        return self.seconds * self.nodes / 3600


def runner_step_s(runner: str, prediction: Any, layers: int) -> float:
    """The runner's own step: the attention runner (also what ``auto`` measures with) times
    one layer's attention (compute and exposed communication); a training-step runner
    (``bridge``) the whole predicted step."""
    if runner != "bridge":
        core = prediction.compute_s + prediction.exposed_a2a_s + prediction.exposed_p2p_s
        return core / max(1, layers)
    return prediction.step_time_s


def trials_per_job(setting: Any, queued: int, slots: int) -> int:
    """How many trials the next job of a world size runs: ``executor.trials_per_job``, or
    for ``auto`` that world size's ``queued`` trials spread evenly over the ``slots`` free
    (1 on a CPU profile, whose trials must not share the cores; ``array_parallelism`` on
    GPUs, which run side by side), at most ``AUTO_TRIALS_PER_JOB_MAX``."""
    if setting != "auto":
        return int(setting)
    from hcp_tune.config.settings import AUTO_TRIALS_PER_JOB_MAX

    return max(1, min(AUTO_TRIALS_PER_JOB_MAX, math.ceil(queued / max(1, slots))))


def job_slots(cfg: Any) -> int:
    """Jobs a sweep keeps running at once: 1 on a CPU profile (trials side by side would
    rank the contention for the cores, not the layouts), ``array_parallelism`` on GPUs."""
    return 1 if cfg.cluster.device == "cpu" else cfg.executor.array_parallelism


def step_at_m(prediction: Any, m: int, user_m: int) -> float:
    """The predicted step at ``m`` micro-batches from the prediction at ``user_m``: the
    cost model's step is its bubble plus ``user_m`` equal micro-batch slots."""
    bubble = getattr(prediction, "bubble_s", 0.0)
    return bubble + (prediction.step_time_s - bubble) * m / max(1, user_m)


def trial_cost(cfg: Any, cand: Any, prediction: Any, per_job: int = 1) -> TrialCost:
    """A trial of ``cand``: warm-up, measured and proof steps, plus its share of a job's
    start-up (``per_job`` trials share one). runner=bridge measures a trial by one run per
    ``costmodel.microbatch.measure_points`` (m = pp, 2*pp and 3*pp; fresh processes each, so each
    pays the start-up), each step at its own m."""
    steps = cfg.runner.warmup_steps + cfg.runner.measure_steps + PROOF_STEPS
    if cfg.runner.name == "bridge":
        user_m = cfg.micro_batches
        ms = measure_points(cand.pp, user_m)
        seconds = sum(steps * step_at_m(prediction, m, user_m) for m in ms)
        seconds += JOB_START_S * len(ms) / max(1, per_job)
    else:
        ms = (1,)
        step = runner_step_s(cfg.runner.name, prediction, cfg.model.layers)
        seconds = steps * step + JOB_START_S / max(1, per_job)
    # runner=bridge trains the whole world (tp*cp*dp*pp); the attention runner one stage
    ranks = cand.groups.world_size if cfg.runner.name == "bridge" else (
        cand.tp * cand.cp * cand.dp)
    per_node = cfg.cluster.gpus_per_node or ranks
    return TrialCost(seconds=seconds, ranks=ranks, nodes=max(1, math.ceil(ranks / per_node)),
                     runs=len(ms))


def first_repeats(search: Any) -> int:
    """Trials per layout a sweep plans at its start: ``search.min_repeats`` with
    ``search.adaptive`` (more follow only for undecided layouts), else ``search.repeats``."""
    return search.min_repeats if search.adaptive else search.repeats


def costs_by_layout(cfg: Any, ordered: list[tuple[Any, Any]]) -> dict[tuple[int, int, int], TrialCost]:
    """(tp, seq, a2a) -> TrialCost, from ``predict.ordering``'s (candidate, prediction);
    a job's start-up is shared as ``executor.trials_per_job`` will pack the trials."""
    per_world: dict[int, int] = {}
    for c, _ in ordered:
        per_world[c.tp * c.cp] = per_world.get(c.tp * c.cp, 0) + 1
    slots, setting = job_slots(cfg), cfg.executor.trials_per_job
    return {(c.tp, c.seq, c.layout.a2a): trial_cost(
                cfg, c, p, trials_per_job(setting, per_world[c.tp * c.cp]
                                          * first_repeats(cfg.search), slots))
            for c, p in ordered}


@dataclass(frozen=True)
class Estimate:
    trials: int
    seconds: float
    gpu_hours: float
    node_hours: float
    runs: int = 0  # Bridge runs (several per trial: one per measured m); 0: one per trial

    def text(self, cpu: bool) -> str:
        unit = "rank-hours (CPU profile: processes)" if cpu else "GPU-hours"
        runs = f" ({self.runs} runs)" if self.runs and self.runs != self.trials else ""
        return (f"estimate: {self.trials} trial(s){runs}, {self.node_hours:.3g} node-hours, "
                f"{self.gpu_hours:.3g} {unit} (cost model + runner steps + "
                f"{JOB_START_S:.0f} s start-up per job; queue wait not included)")


def estimate(costs: list[TrialCost]) -> Estimate:
    return Estimate(trials=len(costs), seconds=sum(c.seconds for c in costs),
                    gpu_hours=sum(c.gpu_hours for c in costs),
                    node_hours=sum(c.node_hours for c in costs),
                    runs=sum(c.runs for c in costs))
