"""``sweep``: measure every kept layout of every sweep key and rank them.

The loop: for each key (tp, seq) an optuna study (``tuner``) asks for layouts; each trial
becomes a ``TrialSpec`` and a submitit job (``dispatch``; runner=bridge measures a trial by
two runs, at m = pp and 3*pp micro-batches, in the same job, and combines them into one
result at the user's m: ``trials.point_specs``, ``trials.combine``); results come back as
``TrialResult`` data, are stored the moment they arrive (``store``), told to the study,
and shown live (``ui``). Up to ``array_parallelism`` trials run at once; the first batch
goes out as one job array, later ones one by one as slots free up, so no batch waits for
its slowest member. A running trial whose steps are clearly slower than the best so far is
stopped (early stopping, the rule in ``should_prune``). Re-running the same command
resumes: stored trials are not re-run and submitted ones are re-attached by job id. What
to run, in which order, and what to resume, skip or re-attach is decided in one pure
function (``sweep_plan.plan_sweep``); the ``Sweeper`` gathers its inputs and does the I/O.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.costmodel.microbatch import measure_points
from hcp_tune.engine import budget, dispatch, housekeeping, sweep_plan
from hcp_tune.engine.store import ResultStore, SweepKey, trial_row
from hcp_tune.engine.sweep_plan import SweepPlan, failure_label, kept_by_key, plan_sweep
from hcp_tune.engine.trials import (
    combine,
    failed_from_job,
    partial_result,
    point_fields,
    point_specs,
    prune_reference,
    read_progress,
    read_result,
    running_point,
    should_prune,
    spec_for,
)
from hcp_tune.errors import ConfigError

# the jobs' payloads, both executors: on the job side, so a job imports none of the orchestrator
from hcp_tune.job.payload import batch_payload, steps_payload
from hcp_tune.space.layout import Candidate
from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    TrialSpec,
    atomic_write_text,
)

POLL_INTERVAL_S = 1.0  # how often the orchestrator polls jobs and progress files


def _count(counts: dict, key: Any, label: str) -> None:
    per_key = counts.setdefault(key, {})
    per_key[label] = per_key.get(label, 0) + 1


@dataclass
class Member:
    """One trial of a running batch job: its spec (the key's m), and the runs that measure
    it (``trials.point_specs``: runner=bridge runs each layout at two m, in order, in the
    same job; any other trial is one run, its spec)."""

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
    """A job and the trials it runs, in order, in the same processes."""

    members: list[Member]
    handle: dispatch.JobHandle
    state: str = "pending"

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

    def kept_failures_total(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for counts in self.kept_failures.values():
            for label, n in counts.items():
                total[label] = total.get(label, 0) + n
        return total


def runs_as_steps(cfg: SweepConfig) -> bool:
    """``executor.batch``: whether a job runs each trial's runs as steps in fresh processes
    (``auto``: for runner=bridge). Raises ``ConfigError`` for a runner=bridge sweep in one
    process set whose trials are two Bridge runs (Bridge runs once per process set)."""
    batch, runner = cfg.executor.batch, cfg.runner.name
    steps = batch == "steps" or (batch == "auto" and runner == "bridge")
    points = measure_points(cfg.pp, cfg.micro_batches)
    if runner == "bridge" and not steps and len(points) > 1:
        raise ConfigError(
            f"executor.batch={batch} with runner=bridge: each layout is measured by "
            f"{len(points)} Bridge runs (m={' and '.join(map(str, points))} micro-batches, "
            "then ranked at the user's m), and Bridge runs one per process set; use "
            "executor.batch=steps (or auto)")
    return steps


class Sweeper:
    """One sweep run: plans the work, keeps the slots full, stores every outcome."""

    def __init__(self, cfg: SweepConfig, reporter: Any, *,
                 only: Optional[dict[tuple[int, int], set[int]]] = None) -> None:

        runner = cfg.runner.name
        if runner not in ("attention", "bridge"):
            raise ValueError(f"Sweeper measures: runner={runner!r} must be resolved first "
                             "(predict.resolve_runner)")
        self.cfg = cfg
        self.reporter = reporter
        self.store = ResultStore(cfg.results_dir)
        self.exec_cfg = dataclasses.replace(
            cfg.executor, folder=cfg.executor.folder or str(cfg.results_dir / "jobs"))
        self.executor_name = dispatch.resolve_executor_name(self.exec_cfg.name)
        # executor.batch: a batch's trials in one process set, or each as its own step
        self.steps = runs_as_steps(cfg)
        self.progress_dir = cfg.results_dir / "progress"
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        # CPU trials share this machine's cores: measured side by side they would rank the
        # contention, not the layouts. GPU trials get their own nodes and run in parallel.
        self.slots = budget.job_slots(cfg)
        self.early_stop = cfg.search.early_stop
        # search.storage: one storage for every key; by default one journal per key under
        # results/journals/, each replayed only when its key is planned or swept
        self.storage = self.store.ledger(cfg.search.storage)
        self.only = only  # (tp, seq) -> the a2a sizes to measure; None: every kept layout
        self.planned: Optional[SweepPlan] = None  # set by plan()
        self.marker: Optional[Path] = None  # results/sweeps/<host>-<pid>-*.running
        self.studies: dict[SweepKey, Any] = {}  # one tuner.LayoutStudy per key
        # (tp, seq, a2a) -> budget.TrialCost, from the plan: the budget's per-trial estimate
        self.costs: dict[tuple[int, int, int], Any] = {}
        self.budget = cfg.search.budget_gpu_hours
        self.spent_gpu_hours = 0.0  # the estimate of what this run has submitted
        self.queue: list[Work] = []
        self.running: list[Running] = []
        self.summary = SweepSummary(retry=str(cfg.search.retry))
        self.best: dict[str, dict[str, Any]] = {}  # key name -> best ok row

    # ---------------------------------------------------------------- planning / resume
    def key_for(self, cand: Candidate) -> SweepKey:
        return sweep_plan.key_for(self.cfg, cand)

    def plan(self) -> SweepPlan:
        """Gather what is stored and what earlier runs submitted, make the plan
        (``sweep_plan.plan_sweep``) and apply it: store the skipped layouts, re-attach
        the outstanding trials by job id, queue the rest."""
        from hcp_tune.costmodel import predict
        from hcp_tune.engine import tuner

        if self.marker is None:  # `results drop|archive` waits for the end of this sweep
            self.marker = housekeeping.mark_sweep(self.store)
        # only the planned keys' rows: reading each key's folder costs what the key holds,
        # where reading the whole folder cost every stored trial (on every resume)
        kept_keys = kept_by_key(self.cfg)
        rows = [r for key in kept_keys for r in self.store.key_rows(key)]
        stored_ids = {r.get("trial_id") for r in rows}
        outstanding = {}
        for key, kept in kept_keys.items():
            study = tuner.LayoutStudy(self.storage, key.name, [c.layout.a2a for c in kept])
            study.abandon_unsubmitted()
            self.studies[key] = study
            outstanding[key] = study.outstanding(stored_ids)
        plan = plan_sweep(self.cfg, rows, outstanding, params=predict.params_for(self.cfg),
                          only=self.only)
        self._apply(plan)
        return plan

    def _apply(self, plan: SweepPlan) -> None:
        self.planned = plan
        s = self.summary
        s.keys = plan.keys
        s.resumed, s.reattached, s.retried = plan.resumed, plan.reattached, plan.retried
        s.kept_failures = {k: dict(v) for k, v in plan.kept_failures.items()}
        s.estimate = plan.estimate_text
        self.costs = dict(plan.costs)
        for key, rows in plan.stored.items():
            for r in rows:
                self._note_best(key, r)
        for skip in plan.skipped:
            self._store_skipped(skip.key, skip.cand, {
                "reason": skip.reason, "predicted": {"step_time_s": skip.predicted_step_s}},
                study=self.studies.get(skip.key))
        jobs: dict[tuple, Running] = {}
        for r in plan.reattach:
            o = r.trial
            spec = spec_for(self.cfg, r.cand, o.trial_id, self.progress_dir)
            job = (o.executor, o.folder, o.job_id)  # a batch's trials share their job
            if job not in jobs:
                jobs[job] = Running([], dispatch.attach(o.folder, o.job_id, o.executor))
                self.running.append(jobs[job])
            jobs[job].members.append(
                Member(r.key, self.studies[r.key], o.number, spec, r.cand, plan.kept[r.key]))
        for run in self.running:  # the job runs them in trial-number order
            run.members.sort(key=lambda m: m.number)
        self.queue.extend(Work(p.key, self.studies[p.key], p.cand, plan.kept[p.key])
                          for p in plan.queue)

    def _store_skipped(self, key: SweepKey, cand: Candidate, skip: dict[str, Any],
                       study: Any = None) -> None:
        """A layout the cost model says not to measure: its row file, and a PRUNED trial
        with status ``skipped`` in the key's study (``study``, or the key's study opened
        here; then its a2a is an attribute, not a parameter)."""
        from hcp_tune.engine import tuner

        trial_id = f"{key.slug}-skip-a{cand.layout.a2a}"
        spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
        result = TrialResult(trial_id=trial_id, status=Status.SKIPPED, error=skip["reason"])
        row = trial_row(key, spec, result,
                        predicted_step_s=skip["predicted"]["step_time_s"])
        self.store.add(row, key)
        (study or tuner.LayoutStudy(self.storage, key.name, [])).add_row(row)
        self.summary.by_status["skipped"] = self.summary.by_status.get("skipped", 0) + 1
        self.reporter.trial(spec, "skipped", skip["reason"])

    def _note_best(self, key: SweepKey, row: dict[str, Any]) -> None:
        if row["status"] == Status.OK.value and row.get("median_s"):
            cur = self.best.get(key.name)
            if cur is None or row["median_s"] < cur["median_s"]:
                self.best[key.name] = row

    # ---------------------------------------------------------------- submission
    def _executor(self, spec: TrialSpec, trials: int):
        """The same job for both executors: one task per rank, GPUs only on a GPU profile;
        a steps batch runs one driver task (it starts each trial's ranks itself)."""
        gpus = self.cfg.cluster.gpus_per_node if self.cfg.cluster.device == "cuda" else 0
        ex = dispatch.make_executor(self.exec_cfg, world_size=spec.world_size, gpus_per_node=gpus,
                                    tasks_per_node=1 if self.steps and self.executor_name == "local"
                                    else None)
        if self.steps and self.executor_name == "slurm":  # one driver; it runs srun steps
            dispatch.use_steps(ex, self.exec_cfg)
        if trials > 1:  # executor.time_limit_min is per run: a batch gets one per run
            dispatch.scale_time_limit(ex, self.exec_cfg, trials)
        return ex

    def _args(self, specs: list[TrialSpec]) -> tuple:
        if self.steps:  # executor.batch=steps: each trial its own process set (job.steps)
            launch = None
            if self.executor_name == "slurm":
                cuda = self.cfg.cluster.device == "cuda"
                launch = dispatch.step_launch(
                    self.exec_cfg, world_size=specs[0].world_size,
                    gpus_per_node=self.cfg.cluster.gpus_per_node if cuda else 0)
            return (steps_payload, specs, launch,
                    str(self.cfg.results_dir / "trials" / f"{specs[0].trial_id}.steps"))
        return (batch_payload, specs)

    def _cost(self, work: Work) -> Any:
        return self.costs.get((work.cand.tp, work.cand.seq, work.cand.layout.a2a))

    def _stop_for_budget(self, cost: Any) -> None:
        """The next trial's estimate would take what was submitted past
        ``search.budget_gpu_hours``: submit nothing more, and say so."""
        self.summary.budget_stop = (
            f"search.budget_gpu_hours={self.budget:g}: stopped submitting at an estimated "
            f"{self.spent_gpu_hours:.3g} GPU-hours submitted (the next trial would add "
            f"{cost.gpu_hours:.3g}); {len(self.queue)} trial(s) not run: raise the budget and "
            "run the same command again to resume")
        self.queue.clear()

    def _take_batch(self, free: int) -> list[Work]:
        """The next job's trials: up to ``trials_per_job`` queued trials of the first one's
        world size (``auto``: its queued trials spread evenly over the ``free`` slots),
        in queue order, within the budget, at most one per layout and key (a
        repeat runs in another job: another allocation, other processes, so repeats
        sample what varies between jobs), then grouped by layout (in the order
        the layouts first appear) so a layout's groups are built once and reused across
        sequence lengths."""
        world = self.queue[0].cand.tp * self.queue[0].cand.cp
        # Bridge sets up its global state per pretrain run: in one process set, one Bridge
        # trial per job; as steps (fresh processes each), trials_per_job of them
        bridge_alone = self.cfg.runner.name == "bridge" and not self.steps
        same_world = sum(w.cand.tp * w.cand.cp == world for w in self.queue)
        limit = 1 if bridge_alone else budget.trials_per_job(
            self.exec_cfg.trials_per_job, same_world, max(1, free))
        picked: list[Work] = []
        taken: set[tuple] = set()  # (key, a2a): a repeat goes to another job, not this one
        for w in list(self.queue):
            if len(picked) == limit:
                break
            if w.cand.tp * w.cand.cp != world or (w.key, w.cand.layout.a2a) in taken:
                continue
            price = self._cost(w)
            if (self.budget is not None and price is not None
                    and self.spent_gpu_hours + price.gpu_hours > self.budget):
                self._stop_for_budget(price)
                break
            self.spent_gpu_hours += price.gpu_hours if price else 0.0
            self.queue.remove(w)
            picked.append(w)
            taken.add((w.key, w.cand.layout.a2a))
        first: dict[tuple, int] = {}
        for i, w in enumerate(picked):
            first.setdefault((w.cand.tp, w.cand.layout.a2a), i)
        return sorted(picked, key=lambda w: first[(w.cand.tp, w.cand.layout.a2a)])

    def fill(self) -> None:
        """Submit queued trials into free slots, ``trials_per_job`` per job (the first
        jobs as one job array when they have one shape)."""
        free = self.slots - len(self.running)
        batches: list[list[Member]] = []
        while free > 0 and self.queue:
            members = []
            works = self._take_batch(free)
            if not works:
                break  # the budget stopped it
            for work in works:
                number, trial_id, a2a = work.study.ask(work.cand.layout.a2a, work.key.slug)
                cand = next(c for c in work.kept if c.layout.a2a == a2a)
                spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
                member = Member(work.key, work.study, number, spec, cand, work.kept)
                for stale in (spec.stop_path, *(p.result_path for p in member.points)):
                    Path(stale).unlink(missing_ok=True)
                members.append(member)
            batches.append(members)
            free -= 1
        if not batches:
            return
        specs = [[p for m in b for p in m.points] for b in batches]  # every run, in order
        same_shape = len({(b[0].world_size, len(b)) for b in specs}) == 1
        if len(batches) > 1 and same_shape:
            ex = self._executor(specs[0][0], len(specs[0]))
            fn = self._args(specs[0])[0]
            handles = dispatch.submit_array(ex, fn, [self._args(b)[1:] for b in specs])
        else:
            handles = []
            for b in specs:
                fn, *args = self._args(b)
                handles.append(dispatch.submit(self._executor(b[0], len(b)), fn, *args))
        for members, handle in zip(batches, handles):
            # tracked first: a Ctrl-C between here and the ledger write still cancels the job
            self.running.append(Running(members, handle))
            for m in members:
                m.study.submitted(m.number, handle.job_id, handle.executor, str(handle.folder))
                self.reporter.trial(m.spec, "submitted", f"job {handle.job_id}")

    # ---------------------------------------------------------------- collection
    def record(self, run: Running, member: Member, result: TrialResult,
               results: Optional[list[Optional[TrialResult]]] = None) -> None:
        """Store a trial's outcome; ``results``: its runs' (``Member.results``), whose m,
        medians and fit the row carries when it has several."""
        member.done = True
        result.job_id = result.job_id or run.handle.job_id
        if not result.log_path:
            result.log_path = str(dispatch.job_paths(run.handle)[1])
        micro = point_fields(member.spec, member.points,
                             results if results is not None else [None] * len(member.points))
        row = trial_row(member.key, member.spec, result, micro=micro)
        self.store.add(row, member.key)  # the view first: a rebuild imports it if we die now
        values = (result.median_s, float(result.peak_mem_bytes or 0)) if result.median_s else None
        member.study.tell(member.number, result.status, values, row=row)
        self._note_best(member.key, row)
        self.summary.stored += 1
        not_run = len(self.queue) + len(run.open())  # queued, and the rest of its batch
        if result.failure_class is FailureClass.ENVIRONMENT and not_run and not self.summary.aborted:
            # the same software stack runs every trial: the rest would fail the same way (the
            # batch's unrun trials are not requeued either: ``requeue``)
            self.summary.aborted = (
                f"stopped submitting after an environment failure ({result.error}); "
                f"{not_run} trial(s) not run: fix the environment and run the same "
                "command again to resume")
            self.queue.clear()
        if result.status is Status.PRUNED and not (result.error or "").startswith("cancelled"):
            self.summary.pruned += 1
            ran = len(result.step_times_s)
            if len(member.points) > 1:  # every run's measured steps (later runs: none)
                ran = sum(len(r.step_times_s) for r in results or [] if r is not None)
            self.summary.pruned_saved_steps += max(
                0, member.spec.measure_steps * len(member.points) - ran)
        s = result.status.value
        self.summary.by_status[s] = self.summary.by_status.get(s, 0) + 1
        label = failure_label(row)
        if label:
            _count(self.summary.failures, member.key, label)
        detail = f"median {result.median_s:.4g} s" if result.median_s else (result.error or "")
        if result.failure_class:
            detail = f"{result.failure_class.value}: {detail}"
        self.reporter.trial(member.spec, s, detail, best=self.best.get(member.key.name))

    def requeue(self, member: Member) -> None:
        """A trial its batch never ran (the processes broke before it): back to the front
        of the queue, as a new optuna trial; the unrun one ends FAIL, marked not run."""
        member.done = True
        member.study.not_run(member.number)
        if self.summary.aborted:
            return  # an environment failure stopped the sweep: the next run measures it
        self.queue.insert(0, Work(member.key, member.study, member.cand, member.kept))
        self.summary.requeued += 1
        self.reporter.trial(member.spec, "requeued", "not run: its batch ended before it")

    def _collect_landed(self, run: Running, finished: bool) -> None:
        """Results the job wrote so far (a trial's once its runs decide it: ``combine``).
        A FAILED one waits for the job's end, when the peers' result files (a root cause,
        ``read_result``) are in. A run that did not end ok ends its trial: the stop file
        keeps the trial's later runs from starting."""
        for m in run.open():
            results = m.results()
            self._stop_after_failed_run(m, results)
            res = combine(m.spec, m.points, results)
            if res is None:
                continue  # not yet, or not run (decided when the job ends)
            if res.status is Status.FAILED and not finished:
                continue
            self.record(run, m, res, results)

    def _stop_after_failed_run(self, member: Member, results: list[Optional[TrialResult]]
                               ) -> None:
        if member.stopping or len(member.points) == 1 or results[-1] is not None:
            return
        for p, r in zip(member.points, results):
            if r is not None and r.status not in (Status.OK, Status.SKIPPED):
                member.stopping = True
                atomic_write_text(member.spec.stop_path, (
                    f"not run: the run at m={p.micro_batches} ended {r.status.value}"))
                return

    def _finish(self, run: Running, out: dispatch.JobOutcome) -> None:
        """The job ended: store what it returned or wrote; the trial it was running when it
        ended without a result gets the job's verdict; trials it never ran go back to the
        queue (or, when the job was ended from outside, are ``cancelled`` with it)."""
        returned = out.result if out.state == dispatch.JobState.DONE else None
        if isinstance(returned, TrialResult):
            returned = [returned]
        by_id = {r.trial_id: r for r in (returned or []) if isinstance(r, TrialResult)}
        for m in run.open():  # read_result merges a peer's root cause
            results = m.results(by_id)
            res = combine(m.spec, m.points, results)
            if res is not None:
                self.record(run, m, res, results)
        verdict: Optional[TrialResult] = None
        for m in run.open():
            if any(r is not None and r.status is Status.SKIPPED for r in m.results(by_id)):
                self.requeue(m)  # SKIPPED by the job: an earlier trial broke the processes
            elif verdict is None or verdict.status is Status.CANCELLED:
                verdict = failed_from_job(m.spec, out)
                self.record(run, m, verdict, m.results(by_id))
            else:
                self.requeue(m)

    def poll(self) -> None:
        outcomes = dispatch.poll_all([r.handle for r in self.running])
        still = []
        for run, out in zip(self.running, outcomes):
            self._collect_landed(run, out.finished)
            if out.finished:
                self._finish(run, out)
                continue
            if out.state.value != run.state:
                run.state = out.state.value
                for m in run.open():
                    self.reporter.trial(m.spec, run.state, f"job {run.handle.job_id}")
            if self.early_stop:
                for m in run.open():
                    self._prune(m)
            if run.open():
                still.append(run)
        self.running = still

    def _prune(self, member: Member) -> bool:
        """Early stop: write the trial's stop file; the job ends it PRUNED at its next step
        and goes on with the batch's next trial. True when the stop file was written."""
        if member.stopping:
            return False
        point = running_point(member.points, [read_result(p) for p in member.points])
        steps = read_progress(point.progress_path)
        if len(steps) >= point.measure_steps:
            return False  # measuring is over: stopping now saves nothing, the result is coming
        # a Bridge run at m micro-batches is compared with the best layout's step at that m
        m = point.micro_batches if point.runner == "bridge" else None
        ref = prune_reference(self.best.get(member.key.name), m, member.key.micro_batches)
        if not should_prune(steps, ref):
            return False
        at = f" at m={m}" if m is not None and len(member.points) > 1 else ""
        member.stopping = True
        atomic_write_text(member.spec.stop_path, (
            f"stopped early: fastest of {len(steps)} steps{at} {min(steps):.4g} s > best "
            f"median {ref['median_s']:.4g} s beyond its noise"))
        return True

    def cancel_all(self) -> None:
        """Ctrl-C: stop every outstanding trial (stop files, then cancel the jobs) and
        record each as cancelled; the next run measures them again."""
        reason = "cancelled by the user (Ctrl-C)"
        for run in self.running:
            for m in run.open():
                atomic_write_text(m.spec.stop_path, reason)
        dispatch.cancel([r.handle for r in self.running])
        for run in self.running:
            for m in run.open():
                results = m.results()
                point = running_point(m.points, results)
                steps = read_progress(point.progress_path)
                res = partial_result(m.spec, Status.CANCELLED, steps, reason)
                if len(m.points) > 1:
                    res.median_s = None  # steps at a run's m, not at the user's
                self.record(run, m, res, results)
                Path(m.spec.stop_path).unlink(missing_ok=True)  # the jobs are cancelled
        self.running = []

    # ---------------------------------------------------------------- the loop
    def run(self) -> SweepSummary:
        if self.planned is None:
            self.plan()
        self.reporter.start(len(self.queue) + sum(len(r.members) for r in self.running),
                            self.summary)
        try:
            try:
                while self.queue or self.running:
                    self.fill()
                    self.poll()
                    if self.running:
                        time.sleep(POLL_INTERVAL_S)  # orchestrator's polling cadence
            except KeyboardInterrupt:
                self.cancel_all()
                self.store.rebuild(self.storage)
                raise
            finally:
                self.reporter.stop()
            self.store.rebuild(self.storage)  # row files and tables, as views of the studies
        finally:
            housekeeping.unmark_sweep(self.marker)
        self.summary.recommendations = self.store.recommendations()
        return self.summary
