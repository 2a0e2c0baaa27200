"""What a running sweep holds: the trials it queued (``Work``), the jobs it submitted and
the trials each runs (``Running``, ``Member``), and what it tells the user at the end
(``SweepSummary``); and whether a job runs its trials as steps (``runs_as_steps``).

Data only (plus ``Member.results``, which reads a trial's result files): ``sweep.Sweeper``
fills and submits, ``sweep_collect.Collector`` stores what comes back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.costmodel.microbatch import measure_points
from hcp_tune.engine import dispatch
from hcp_tune.store.folder import SweepKey
from hcp_tune.engine.trials import point_specs, read_result
from hcp_tune.errors import ConfigError
from hcp_tune.space.layout import Candidate
from hcp_tune.spec import TrialResult, TrialSpec


def count(counts: dict, key: Any, label: str) -> None:
    """One more ``label`` for ``key`` in a per-key tally."""
    per_key = counts.setdefault(key, {})
    per_key[label] = per_key.get(label, 0) + 1


@dataclass
class Member:
    """One trial of a running batch job: its spec (the key's m), and the runs that measure
    it (``trials.point_specs``: runner=bridge runs each layout at several m (pp, 2pp,
    3pp), in order, in the same job; any other trial is one run, its spec)."""

    key: SweepKey
    study: Any
    number: int
    spec: TrialSpec
    cand: Optional[Candidate] = None
    kept: list[Candidate] = field(default_factory=list)
    done: bool = False  # its outcome is stored
    stopping: bool = False  # its stop file is written (early stop)
    points: list[TrialSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.points:
            self.points = point_specs(self.spec)

    def results(self, by_id: Optional[dict[str, TrialResult]] = None
                ) -> list[Optional[TrialResult]]:
        """Each run's result so far (its file, or what the job returned), in run order."""
        by_id = by_id or {}
        return [read_result(p) or by_id.get(p.trial_id) for p in self.points]


@dataclass
class Running:
    """A job and the trials it runs, in order, in the same processes; in a kept allocation
    (``pool``), process set ``set_n`` of the pool's job runs them."""

    members: list[Member]
    handle: dispatch.JobHandle
    state: str = "pending"
    pool: Any = None  # pools.Pool
    set_n: int = 0

    def open(self) -> list[Member]:
        return [m for m in self.members if not m.done]


@dataclass
class Work:
    key: SweepKey
    study: Any
    cand: Candidate
    kept: list[Candidate]


@dataclass
class SweepSummary:
    stored: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    resumed: int = 0
    reattached: int = 0
    pruned: int = 0
    aborted: str = ""  # why the sweep stopped submitting early, if it did
    pruned_saved_steps: int = 0
    # search.adaptive: per key, its verdict when the sweep stopped measuring it
    verdicts: dict[SweepKey, str] = field(default_factory=dict)
    adaptive_rounds: int = 0  # trials queued because a key was still unsettled
    adaptive_note: str = ""  # search.adaptive: what comes after the planned trials
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    keys: list[SweepKey] = field(default_factory=list)  # every key with a kept layout
    # per key, by failure class (or "invalid"): what this run measured without a usable
    # result, and the stored failures kept from earlier runs that search.retry would redo
    failures: dict[SweepKey, dict[str, int]] = field(default_factory=dict)
    kept_failures: dict[SweepKey, dict[str, int]] = field(default_factory=dict)
    retried: int = 0  # stored failures measured again because of search.retry
    requeued: int = 0  # trials a broken batch never ran, sent again in a new job
    estimate: str = ""  # what the planned trials will cost, estimated (budget.Estimate.text)
    budget_stop: str = ""  # why search.budget_gpu_hours stopped submitting, if it did
    retry: str = "none"  # search.retry as given
    # (tp, seq) of the keys runner=bridge refused: every layout predicted not to fit
    refused: list[tuple[int, int]] = field(default_factory=list)

    def kept_failures_total(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for counts in self.kept_failures.values():
            for label, n in counts.items():
                total[label] = total.get(label, 0) + n
        return total


def runs_as_steps(cfg: SweepConfig) -> bool:
    """``executor.batch``: whether a job runs each trial's runs as steps in fresh processes
    (``auto``: for runner=bridge). Raises ``ConfigError`` for a runner=bridge sweep in one
    process set whose trials are several Bridge runs (Bridge runs once per process set)."""
    batch, runner = cfg.executor.batch, cfg.runner.name
    steps = batch == "steps" or (batch == "auto" and runner == "bridge")
    points = measure_points(cfg.pp, cfg.micro_batches)
    if runner == "bridge" and not steps and len(points) > 1:
        raise ConfigError(
            f"executor.batch={batch} with runner=bridge: each layout is measured by "
            f"{len(points)} Bridge runs (m={', '.join(map(str, points))} micro-batches, "
            "then ranked at the user's m), and Bridge runs one per process set; use "
            "executor.batch=steps (or auto)")
    return steps
