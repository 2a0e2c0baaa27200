"""The collecting half of a sweep: poll the jobs, store each trial's outcome the moment it
lands, stop a clearly slower trial early, requeue what a broken batch never ran, and
cancel everything on Ctrl-C.

What belongs here: ``Collector``, the ``sweep.Sweeper``'s methods from a job's results to
a stored row, including the multi-run trials of runner=bridge (a trial measured by runs at
several m, combined into one result at the user's m: ``trials.combine``,
``trials.point_fields``, ``running_point``; a failed run stops the trial's later runs).
The Sweeper owns the state these methods use (``store``, ``queue``, ``running``, ``best``,
``summary``, ``reporter``) and is told of each stored row (``stored``: the adaptive rounds).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from hcp_tune.engine import dispatch, pools
from hcp_tune.store.folder import trial_row
from hcp_tune.engine.sweep_jobs import Member, Running, Work, count
from hcp_tune.engine.sweep_plan import failure_label
from hcp_tune.engine.trials import (
    combine,
    failed_from_job,
    partial_result,
    point_fields,
    prune_reference,
    read_progress,
    read_result,
    running_point,
    should_prune,
)
from hcp_tune.spec import FailureClass, Status, TrialResult, atomic_write_text


class Collector:
    """Mixed into ``sweep.Sweeper``: from a job's results to stored rows."""

    store: Any
    queue: list[Work]
    running: list[Running]
    best: dict[str, dict[str, Any]]
    summary: Any
    reporter: Any
    early_stop: bool
    idle: list  # pools.Pool: kept allocations whose batch ended

    def _note_best(self, key: Any, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def stored(self, member: Member, row: dict[str, Any]) -> None:
        """A trial's row was stored (the Sweeper: its best and adaptive rounds)."""
        raise NotImplementedError

    def prunable(self, member: Member) -> bool:
        """Whether early stopping may stop this trial (the Sweeper: not the best's)."""
        raise NotImplementedError

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
            count(self.summary.failures, member.key, label)
        detail = f"median {result.median_s:.4g} s" if result.median_s else (result.error or "")
        if result.failure_class:
            detail = f"{result.failure_class.value}: {detail}"
        self.reporter.trial(member.spec, s, detail, best=self.best.get(member.key.name))
        self.stored(member, row)

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
            job = out
            if run.pool is not None and pools.untaken(run.pool, run.set_n, job):
                for m in run.open():  # its allocation ended before the set started
                    self.requeue(m)
                continue
            if run.pool is not None:  # a kept allocation: its process set's end
                out = pools.outcome(run.pool, run.set_n, job)
            self._collect_landed(run, out.finished)
            if out.finished:
                self._finish(run, out)
                if run.pool is not None and not job.finished and not run.pool.unusable:
                    self.idle.append(run.pool)  # up, and ready for the next batch
                continue
            if out.state.value != run.state:
                run.state = out.state.value
                for m in run.open():
                    self.reporter.trial(m.spec, run.state, f"job {run.handle.job_id}")
            if self.early_stop:
                for m in run.open():
                    self._prune(m)
            if run.open() or run.pool is not None:  # a pool's set: kept until it ended
                still.append(run)
        self.running = still

    def _prune(self, member: Member) -> bool:
        """Early stop: write the trial's stop file; the job ends it PRUNED at its next step
        and goes on with the batch's next trial. True when the stop file was written."""
        if member.stopping or not self.prunable(member):
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
        dispatch.cancel([r.handle for r in self.running] + [p.handle for p in self.idle])
        self.idle = []
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
