"""``sweep``: measure the kept layouts of every sweep key until each key's ranking is
settled or a tie (or every layout has ``search.repeats`` trials), and rank them.

The loop: for each key (tp, seq) an optuna study (``store.studies``) asks for layouts; each trial
becomes a ``TrialSpec`` and a submitit job (``dispatch``; runner=bridge measures a trial by
several runs at different m in the same job and combines them into one result at the
user's m: ``sweep_collect``); results come back as ``TrialResult`` data, are stored the
moment they arrive (``store``), told to the study, and shown live (``ui``). Up to
``array_parallelism`` trials run at once; the first batch goes out as one job array, later
ones one by one as slots free up, so no batch waits for its slowest member; with
``executor.keep_allocation`` a job whose batch ended takes the next batch of its world size
in fresh processes of the same allocation (``pools``), instead of a new job. A running
trial whose steps are clearly slower than the best layout's figure is stopped (early
stopping, the rule in ``should_prune``; the best layout's own repeats never are: that
would bias its figure). With ``search.adaptive`` (the default) every layout first gets
``search.min_repeats`` trials, then only the undecided ones get more, a round at a time
(``sweep_adaptive.next_round``, decided from the stored rows). Re-running the same command
resumes: stored trials are not re-run and submitted ones are re-attached by job id. What
to run, in which order, and what to resume, skip or re-attach is decided in one pure
function (``sweep_plan.plan_sweep``); the ``Sweeper`` gathers its inputs and does the I/O,
its collecting half in ``sweep_collect``; its records are in ``sweep_jobs``.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.engine import budget, dispatch, pools, sweep_adaptive, sweep_plan, synthetic
from hcp_tune.engine.sweep_collect import Collector
from hcp_tune.engine.sweep_jobs import (  # noqa: F401  (re-exported: sweep's old names)
    Member,
    Running,
    SweepSummary,
    Work,
    runs_as_steps,
)
from hcp_tune.engine.sweep_plan import SweepPlan, kept_by_key, plan_sweep
from hcp_tune.engine.trialspec import spec_for
from hcp_tune.stats import verdict
from hcp_tune.store import housekeeping
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row

# the jobs' payloads, both executors: on the job side, so a job imports none of the orchestrator
from hcp_tune.job.payload import batch_payload, pool_payload, steps_payload
from hcp_tune.space.layout import Candidate, factorizations
from hcp_tune.spec import Status, TrialResult, TrialSpec

POLL_INTERVAL_S = 1.0  # how often the orchestrator polls jobs and progress files


class Sweeper(Collector):
    """One sweep run: plans the work, keeps the slots full, stores every outcome."""

    def __init__(self, cfg: SweepConfig, reporter: Any, *,
                 only: Optional[dict[tuple[int, int], set[int]]] = None) -> None:

        runner = cfg.runner.name
        if runner not in ("attention", "bridge", "synthetic"):
            raise ValueError(f"Sweeper measures: runner={runner!r} must be resolved first "
                             "(runner_choice.resolve_runner)")
        # runner=synthetic: trials drawn from a truth file, run in this process (no jobs)
        self.truth = synthetic.check_sweep(cfg) if runner == "synthetic" else None
        self.cfg = cfg
        self.reporter = reporter
        self.store = ResultStore(cfg.results_dir)
        self.exec_cfg = dataclasses.replace(
            cfg.executor, folder=cfg.executor.folder or str(cfg.results_dir / "jobs"))
        self.executor_name = ("inprocess" if self.truth is not None
                              else dispatch.resolve_executor_name(self.exec_cfg.name))
        # executor.batch: a batch's trials in one process set, or each as its own step
        self.steps = runs_as_steps(cfg)
        # executor.keep_allocation: each job a pool that takes the next batches (pools.py)
        self.keep = pools.keeps_allocation(cfg, steps=self.steps, synthetic=self.truth is not None)
        self.idle: list[pools.Pool] = []  # kept allocations whose batch ended
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
        self.studies: dict[SweepKey, Any] = {}  # one studies.LayoutStudy per key
        # (tp, seq, a2a) -> budget.TrialCost, from the plan: the budget's per-trial estimate
        self.costs: dict[tuple[int, int, int], Any] = {}
        self.budget = cfg.search.budget_gpu_hours
        self.spent_gpu_hours = 0.0  # the estimate of what this run has submitted
        self.queue: list[Work] = []
        self.running: list[Running] = []
        self.summary = SweepSummary(retry=str(cfg.search.retry))
        self.best: dict[str, dict[str, Any]] = {}  # key name -> the best layout's median row
        self.usable: dict[str, list[dict[str, Any]]] = {}  # key name -> its usable rows
        self.adaptive = cfg.search.adaptive
        self.ended: set[tuple[SweepKey, int]] = set()  # layouts whose trial failed this run
        if self.adaptive:
            self.summary.adaptive_note = (
                f"search.adaptive: {cfg.search.min_repeats} per layout first, then more only "
                f"for layouts not yet separated from the best, up to {cfg.search.repeats}")

    # ---------------------------------------------------------------- planning / resume
    def key_for(self, cand: Candidate) -> SweepKey:
        return sweep_plan.key_for(self.cfg, cand)

    def plan(self) -> SweepPlan:
        """Gather what is stored and what earlier runs submitted, make the plan
        (``sweep_plan.plan_sweep``) and apply it: store the skipped layouts, re-attach
        the outstanding trials by job id, queue the rest."""
        from hcp_tune.costmodel import predict
        from hcp_tune.store import studies

        if self.marker is None:  # `results drop|archive` waits for the end of this sweep
            self.marker = housekeeping.mark_sweep(self.store)
        # only the planned keys' rows: reading each key's folder costs what the key holds,
        # where reading the whole folder cost every stored trial (on every resume)
        kept_keys = kept_by_key(self.cfg)
        rows = [r for key in kept_keys for r in self.store.key_rows(key)]
        stored_ids = {r.get("trial_id") for r in rows}
        outstanding = {}
        for key, kept in kept_keys.items():
            study = studies.LayoutStudy(self.storage, key.name, [c.layout.a2a for c in kept],
                                      space=[lay.a2a for lay in factorizations(key.cp)])
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
        s.refused = list(plan.refused)
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
        from hcp_tune.store import studies

        trial_id = f"{key.slug}-skip-a{cand.layout.a2a}"
        spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
        result = TrialResult(trial_id=trial_id, status=Status.SKIPPED, error=skip["reason"])
        row = trial_row(key, spec, result,
                        predicted_step_s=skip["predicted"]["step_time_s"])
        self.store.add(row, key)
        (study or studies.LayoutStudy(self.storage, key.name, [])).add_row(row)
        self.summary.by_status["skipped"] = self.summary.by_status.get("skipped", 0) + 1
        self.reporter.trial(spec, "skipped", skip["reason"])

    def _note_best(self, key: SweepKey, row: dict[str, Any]) -> None:
        """The key's best so far: the median trial of the layout with the lowest figure
        (``verdict.figures``), what early stopping compares with."""
        if not verdict.usable(row):
            return
        rows = self.usable.setdefault(key.name, [])
        rows.append(row)
        # with intervals once a layout has 2 trials: the best's trial-to-trial spread is
        # part of the early-stop margin (trials.should_prune)
        best = verdict.figures(rows, intervals=len(rows) > len({r["a2a"] for r in rows}))[0]
        self.best[key.name] = {**best.row, "between_sd": best.sd_log or 0.0}

    def prunable(self, member: Member) -> bool:
        """Early stopping never stops a trial of the best layout: its slower repeats would
        leave its figure biased fast."""
        best = self.best.get(member.key.name)
        return best is None or (best["a2a"], best["p2p"]) != (member.spec.a2a, member.spec.p2p)

    # ---------------------------------------------------------------- adaptive rounds
    def stored(self, member: Member, row: dict[str, Any]) -> None:
        if not self.adaptive:
            return
        if row["status"] in (Status.FAILED.value, Status.INVALID.value, Status.CANCELLED.value):
            # not measured again in this run (as an exhaustive sweep would not): the next
            # run does, by its plan and search.retry
            self.ended.add((member.key, member.spec.a2a))
        if row["status"] == Status.PRUNED.value and not str(row.get("error") or "").startswith(
                "cancelled"):  # it lost: its queued repeats would lose again
            a2a = member.spec.a2a
            self.queue = [w for w in self.queue
                          if not (w.key == member.key and w.cand.layout.a2a == a2a)]
        if not self.summary.aborted and not self.summary.budget_stop:
            self._next_round(member.key)

    def _pending(self, key: SweepKey) -> bool:
        return (any(w.key == key for w in self.queue)
                or any(m.key == key for run in self.running for m in run.open()))

    def _next_round(self, key: SweepKey) -> None:
        """Once none of the key's trials is queued or running: decide from its stored rows
        (``sweep_adaptive.next_round``) and queue one more trial of each undecided layout,
        or note the key's verdict."""
        if key not in self.studies or self._pending(key):
            return
        kept = self.planned.kept[key] if self.planned else []
        if self.only is not None:
            kept = [c for c in kept if c.layout.a2a in self.only.get((c.tp, c.seq), set())]
        rows = self.store.key_rows(key)
        s = self.cfg.search
        more = sweep_adaptive.next_round(rows, [c.layout.a2a for c in kept],
                                         min_repeats=s.min_repeats, repeats=s.repeats,
                                         tie_threshold=s.tie_threshold)
        more = [a for a in more if (key, a) not in self.ended]
        by_a2a = {c.layout.a2a: c for c in kept}
        self.queue.extend(Work(key, self.studies[key], by_a2a[a], kept) for a in more)
        self.summary.adaptive_rounds += len(more)
        if not more:
            self.summary.verdicts[key] = verdict.decide(rows, s.tie_threshold).kind

    # ---------------------------------------------------------------- submission
    def _executor(self, spec: TrialSpec, trials: int):
        """The same job for both executors: one task per rank, GPUs only on a GPU profile;
        a steps batch runs one driver task (it starts each trial's ranks itself)."""
        gpus = self.cfg.cluster.gpus_per_node if self.cfg.cluster.device == "cuda" else 0
        driver = self.steps or self.keep  # one driver process starts the ranks itself
        ex = dispatch.make_executor(self.exec_cfg, world_size=spec.world_size, gpus_per_node=gpus,
                                    tasks_per_node=1 if driver and self.executor_name == "local"
                                    else None)
        if driver and self.executor_name == "slurm":  # one driver; it runs srun steps
            dispatch.use_steps(ex, self.exec_cfg)
        if trials > 1:  # executor.time_limit_min is per run: a batch gets one per run
            dispatch.scale_time_limit(ex, self.exec_cfg, trials)
        return ex

    def _launch(self, spec: TrialSpec) -> Any:
        """How a driver starts ranks on SLURM (srun steps); None on the local executor."""
        if self.executor_name != "slurm":
            return None
        cuda = self.cfg.cluster.device == "cuda"
        return dispatch.step_launch(self.exec_cfg, world_size=spec.world_size,
                                    gpus_per_node=self.cfg.cluster.gpus_per_node if cuda else 0)

    def _args(self, specs: list[TrialSpec]) -> tuple:
        if self.steps:  # executor.batch=steps: each trial its own process set (job.steps)
            return (steps_payload, specs, self._launch(specs[0]),
                    str(self.cfg.results_dir / "trials" / f"{specs[0].trial_id}.steps"))
        if self.keep:  # a pool: this batch first, then the next ones it is handed
            root, launch = pools.root_for(self.cfg.results_dir, specs[0]), self._launch(specs[0])
            return (pool_payload, specs, str(root), launch,
                    pools.forks(self.cfg, launch.nodes if launch else 1), str(self.marker or ""))
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

    def _take_batch(self, free: int, world: Optional[int] = None,
                    cap: Optional[int] = None) -> list[Work]:
        """The next batch: up to ``trials_per_job`` (``auto``: the world size's queued
        trials spread evenly over the ``free`` slots) and ``cap`` queued trials of the first
        one's world size (``world``: of this tp*cp, a kept allocation's), in queue order,
        within the budget, at most one per layout and key (a repeat runs in other
        processes: in another job, or another process set of a kept allocation, so repeats
        sample what varies between process sets), then grouped by layout (in the order
        the layouts first appear) so a layout's groups are built once and reused across
        sequence lengths."""
        world = world or self.queue[0].cand.tp * self.queue[0].cand.cp
        # Bridge sets up its global state per pretrain run: in one process set, one Bridge
        # trial per job; as steps (fresh processes each), trials_per_job of them
        bridge_alone = self.cfg.runner.name == "bridge" and not self.steps
        same_world = sum(w.cand.tp * w.cand.cp == world for w in self.queue)
        limit = 1 if bridge_alone else budget.trials_per_job(
            self.exec_cfg.trials_per_job, same_world, max(1, free))
        limit = limit if cap is None else min(limit, cap)
        picked: list[Work] = []
        taken: set[tuple] = set()  # (key, a2a): a repeat goes to another process set
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

    def _members(self, works: list[Work]) -> list[Member]:
        """Each queued trial as an optuna trial and its spec (stale result and stop files
        of its runs removed)."""
        members = []
        for work in works:
            number, trial_id, a2a = work.study.ask(work.cand.layout.a2a, work.key.slug)
            cand = next(c for c in work.kept if c.layout.a2a == a2a)
            spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
            member = Member(work.key, work.study, number, spec, cand, work.kept)
            for stale in (spec.stop_path, *(p.result_path for p in member.points)):
                Path(stale).unlink(missing_ok=True)
            members.append(member)
        return members

    def _track(self, members: list[Member], handle: dispatch.JobHandle,
               pool: Optional[pools.Pool] = None, set_n: int = 0) -> None:
        # tracked first: a Ctrl-C between here and the ledger write still cancels the job
        self.running.append(Running(members, handle, pool=pool, set_n=set_n))
        where = f"job {handle.job_id}" + (f", process set {set_n}" if pool else "")
        for m in members:
            m.study.submitted(m.number, handle.job_id, handle.executor, str(handle.folder))
            self.reporter.trial(m.spec, "submitted", where)

    def _feed_idle(self) -> None:
        """Each kept allocation whose batch ended takes the next batch of its world size
        (as many trials as its time limit still holds); one with nothing to take ends."""
        idle, self.idle = self.idle, []
        for pool in idle:
            fits = pool.trials_that_fit(self.cfg.runner.time_limit_s)
            works = (self._take_batch(max(1, self.slots - len(self.running)),
                                      world=pool.world_size, cap=fits)
                     if fits and self.queue else [])
            if not works:
                pools.end([pool])
                continue
            members = self._members(works)
            self._track(members, pool.handle, pool,
                        pools.feed(pool, [p for m in members for p in m.points]))

    def fill(self) -> None:
        """Hand kept allocations their next batch, then submit queued trials into free
        slots, ``trials_per_job`` per job (the first jobs as one job array when they have
        one shape)."""
        self._feed_idle()
        free = self.slots - len(self.running)
        batches: list[list[Member]] = []
        while free > 0 and self.queue:
            works = self._take_batch(free)
            if not works:
                break  # the budget stopped it
            batches.append(self._members(works))
            free -= 1
        if not batches:
            return
        specs = [[p for m in b for p in m.points] for b in batches]  # every run, in order
        submitted = time.monotonic()
        if self.truth is not None:
            handles = [synthetic.submit(self.truth, self.cfg, b, self.exec_cfg.folder)
                       for b in batches]
        else:
            handles = self._submit(batches, specs)
        for members, handle, runs in zip(batches, handles, specs):
            pool = None
            if self.keep:  # its time limit: executor.time_limit_min per run it was given
                pool = pools.new(handle, pools.root_for(self.cfg.results_dir, runs[0]),
                                 members[0].cand.tp * members[0].cand.cp,
                                 self.exec_cfg.time_limit_min * 60 * len(runs), submitted)
            self._track(members, handle, pool)

    def _submit(self, batches: list[list[Member]], specs: list[list[TrialSpec]]) -> list:
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
        return handles

    # ---------------------------------------------------------------- the loop
    def run(self) -> SweepSummary:
        if self.planned is None:
            self.plan()
        if self.adaptive:  # a resumed key whose min_repeats are in: its next round now
            for key in list(self.studies):
                self._next_round(key)
        self.reporter.start(len(self.queue) + sum(len(r.members) for r in self.running),
                            self.summary)
        try:
            try:
                while self.queue or self.running:
                    self.fill()
                    self.poll()
                    if self.running and self.truth is None:  # synthetic: a step per poll
                        pools.wait_for_poll(self.running, POLL_INTERVAL_S)  # the cadence
            except KeyboardInterrupt:
                self.cancel_all()
                self.store.rebuild(self.storage)
                raise
            finally:
                self.reporter.stop()
            self.store.rebuild(self.storage)  # row files and tables, as views of the studies
        finally:
            pools.release(self.idle)  # no allocation outlives the sweep
            self.idle = []
            housekeeping.unmark_sweep(self.marker)
        self.summary.recommendations = self.store.recommendations()
        return self.summary
