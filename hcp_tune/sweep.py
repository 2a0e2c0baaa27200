"""``sweep``: measure every kept layout of every sweep key and rank them.

The loop: for each key (tp, seq) an optuna study (``tuner``) asks for layouts; each trial
becomes a ``TrialSpec`` and a submitit job (``dispatch``); results come back as
``TrialResult`` data, are stored the moment they arrive (``store``), told to the study,
and shown live (``ui``). Up to ``array_parallelism`` trials run at once; the first batch
goes out as one job array, later ones one by one as slots free up, so no batch waits for
its slowest member. A running trial whose steps are clearly slower than the best so far is
stopped (early stopping, the rule in ``should_prune``). Re-running the same command
resumes: stored trials are not re-run and submitted ones are re-attached by job id.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hcp_tune import dispatch
from hcp_tune.config import SweepConfig
# the jobs' payloads: defined on the job side, so a job imports none of the orchestrator
from hcp_tune.job.payload import slurm_payload
from hcp_tune.launch import local_payload
from hcp_tune.layout import Candidate
from hcp_tune.noise import row_noise
from hcp_tune.plan import candidates
from hcp_tune.settings import RETRY_CHOICES
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec, classify_error_text
from hcp_tune.store import ResultStore, SweepKey, trial_row

POLL_INTERVAL_S = 1.0  # how often the orchestrator polls jobs and progress files
MIN_STEPS_TO_PRUNE = 3  # measured steps a running trial needs before it can be judged
PRUNE_FLOOR = 0.05  # a trial is never stopped for being less than 5% slower than the best


FAILURE_LABELS = RETRY_CHOICES[2:]  # every failure class, and "invalid"


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


def _count(counts: dict, key: Any, label: str) -> None:
    per_key = counts.setdefault(key, {})
    per_key[label] = per_key.get(label, 0) + 1


def spec_for(cfg: SweepConfig, cand: Candidate, trial_id: str, progress_dir: Path) -> TrialSpec:
    """The trial a candidate layout runs, with the ranks its groups must have."""
    r, m = cfg.runner, cfg.model
    return TrialSpec(
        trial_id=trial_id, a2a=cand.layout.a2a, p2p=cand.layout.p2p, tp=cand.tp,
        seq=cand.seq, mbs=cfg.mbs, dtype="fp32" if cfg.cluster.device == "cpu" else cfg.dtype,
        heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim, hidden=m.hidden,
        ffn_hidden=m.ffn_hidden, layers=m.layers, vocab=m.vocab,
        runner=r.name, backend=r.backend, qkv_format=r.qkv_format, warmup_steps=r.warmup_steps,
        measure_steps=r.measure_steps, time_limit_s=r.time_limit_s,
        # one pipeline stage's groups: the attention runner measures a stage (world tp*cp*dp)
        expected_groups=cand.stage_groups(cfg.cluster.gpus_per_node).as_dict(), peak_tflops=cfg.cluster.peak_bf16_tflops,
        device=cfg.cluster.device,
        progress_path=str(progress_dir / f"{trial_id}.jsonl"), env_tag=cfg.env_tag,
        inject_fault=r.inject_fault, bridge_recipe=r.recipe, bridge_overrides=list(r.overrides),
    )


def read_progress(path: Optional[str]) -> list[float]:
    """Measured step times a running trial has written so far.

    The job appends one JSON line per measured step (``{"step": i, "time_s": t}``).
    """
    if not path or not Path(path).exists():
        return []
    times = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written right now
        value = rec.get("time_s", rec.get("step_s"))
        if rec.get("phase", "measure") == "measure" and value is not None:
            times.append(float(value))
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
    """A job that ended without a trial result (killed, timed out, crashed on start)."""
    # SLURM's own verdicts first; otherwise the error text, read as the job side reads it
    cls = {"TIMEOUT": FailureClass.TIME_LIMIT, "OUT_OF_MEMORY": FailureClass.OOM}.get(
        (outcome.scheduler_state or "").upper()) or classify_error_text(outcome.error or "")
    res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, failure_class=cls,
                      error=outcome.error or f"job ended: {outcome.scheduler_state or 'unknown'}")
    res.log_path = str(outcome.stderr) if outcome.stderr else None
    return res


@dataclass
class Running:
    key: SweepKey
    study: Any
    number: int
    spec: TrialSpec
    handle: dispatch.JobHandle
    state: str = "pending"


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
    retry: str = "none"  # search.retry as given

    def kept_failures_total(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for counts in self.kept_failures.values():
            for label, n in counts.items():
                total[label] = total.get(label, 0) + n
        return total


class Sweeper:
    """One sweep run: plans the work, keeps the slots full, stores every outcome."""

    def __init__(self, cfg: SweepConfig, reporter: Any, order: Optional[dict] = None,
                 skips: Optional[list[dict[str, Any]]] = None) -> None:
        from hcp_tune import tuner

        runner = cfg.runner.name
        if runner not in ("attention", "bridge"):
            raise ValueError(f"Sweeper measures: runner={runner!r} must be resolved first "
                             "(predict.resolve_runner)")
        retry = cfg.search.retry
        self.retry = retry_labels(retry)
        self.cfg = cfg
        self.reporter = reporter
        self.store = ResultStore(cfg.results_dir)
        self.exec_cfg = dataclasses.replace(
            cfg.executor, folder=cfg.executor.folder or str(cfg.results_dir / "jobs"))
        self.executor_name = dispatch.resolve_executor_name(self.exec_cfg.name)
        self.progress_dir = cfg.results_dir / "progress"
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        # CPU trials share this machine's cores: measured side by side they would rank the
        # contention, not the layouts. GPU trials get their own nodes and run in parallel.
        self.slots = 1 if cfg.cluster.device == "cpu" else self.exec_cfg.array_parallelism
        self.repeats = cfg.search.repeats
        self.early_stop = cfg.search.early_stop
        storage = cfg.search.storage or str(cfg.results_dir / "optuna.journal")
        self.storage = tuner.open_storage(storage)
        self.order = order or {}  # (tp, seq, a2a) -> predicted seconds, best first
        # (tp, seq, a2a) -> why the cost model says not to measure it (skip factor)
        self.skips = {(s["tp"], s["seq"], s["a2a"]): s for s in (skips or [])}
        self.queue: list[Work] = []
        self.running: list[Running] = []
        self.summary = SweepSummary(retry=str(retry))
        self.best: dict[str, dict[str, Any]] = {}  # key name -> best ok row

    # ---------------------------------------------------------------- planning / resume
    def key_for(self, cand: Candidate) -> SweepKey:
        c = self.cfg
        return SweepKey(cluster=c.cluster.name, model=c.model.name, tp=cand.tp, cp=cand.cp,
                        seq=cand.seq, runner=c.runner.name,
                        env_tag=c.env_tag, pp=cand.pp)

    def plan(self) -> None:
        from hcp_tune import tuner

        rows = self.store.rows()
        groups: dict[SweepKey, list[Candidate]] = {}
        for cand in candidates(self.cfg):
            if cand.kept:
                groups.setdefault(self.key_for(cand), []).append(cand)
        self.summary.keys = list(groups)
        for key, kept in groups.items():
            study = tuner.LayoutStudy(self.storage, key.name, [c.layout.a2a for c in kept])
            study.abandon_unsubmitted()
            key_rows = [r for r in rows if r.get("trial_id", "").startswith(key.slug)]
            for r in key_rows:
                self._note_best(key, r)
            done = self._resume(key, key_rows)
            self.summary.resumed += sum(done.values())
            stored_ids = {r["trial_id"] for r in key_rows}
            for o in study.outstanding(stored_ids):
                cand = next(c for c in kept if c.layout.a2a == o.a2a)
                spec = spec_for(self.cfg, cand, o.trial_id, self.progress_dir)
                handle = dispatch.attach(o.folder, o.job_id, o.executor)
                self.running.append(Running(key, study, o.number, spec, handle))
                done[o.a2a] = done.get(o.a2a, 0) + 1
                self.summary.reattached += 1
            ordered = sorted(kept, key=lambda c: self.order.get((c.tp, c.seq, c.layout.a2a), 0.0))
            for cand in ordered:
                skip = self.skips.get((cand.tp, cand.seq, cand.layout.a2a))
                if skip and not done.get(cand.layout.a2a):
                    self._store_skipped(key, cand, skip)
                    done[cand.layout.a2a] = self.repeats
            for _ in range(self.repeats):
                for cand in ordered:
                    if done.get(cand.layout.a2a, 0) > 0:
                        done[cand.layout.a2a] -= 1
                        continue
                    self.queue.append(Work(key, study, cand, kept))

    def _resume(self, key: SweepKey, key_rows: list[dict[str, Any]]) -> dict[int, int]:
        """Stored trials that stand, per a2a size. Cancelled trials and environment
        failures (fixed by the user, then resumed) are measured again, and so are the
        failures ``search.retry`` names; every other stored outcome stands. Kept failures
        of layouts with nothing better stored are counted, so the user hears of the option."""
        done: dict[int, int] = {}
        kept: dict[int, list[str]] = {}
        retried: dict[int, int] = {}
        for r in key_rows:  # trial ids sort in submission order
            label = failure_label(r)
            if r["status"] == Status.CANCELLED.value or label == FailureClass.ENVIRONMENT.value:
                continue
            if label in self.retry:
                retried[r["a2a"]] = retried.get(r["a2a"], 0) + 1
                continue
            done[r["a2a"]] = done.get(r["a2a"], 0) + 1
            if label:
                kept.setdefault(r["a2a"], []).append(label)
        for a2a, labels in kept.items():
            usable = done[a2a] - len(labels)
            for label in labels[len(labels) - max(0, min(len(labels), self.repeats - usable)):]:
                _count(self.summary.kept_failures, key, label)
        self.summary.retried += sum(min(n, max(0, self.repeats - done.get(a2a, 0)))
                                    for a2a, n in retried.items())
        return done

    def _store_skipped(self, key: SweepKey, cand: Candidate, skip: dict[str, Any]) -> None:
        trial_id = f"{key.slug}-skip-a{cand.layout.a2a}"
        spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
        result = TrialResult(trial_id=trial_id, status=Status.SKIPPED, error=skip["reason"])
        row = trial_row(key, spec, result,
                        predicted_step_s=skip["predicted"]["step_time_s"])
        self.store.add(row, key)
        self.summary.by_status["skipped"] = self.summary.by_status.get("skipped", 0) + 1
        self.reporter.trial(spec, "skipped", skip["reason"])

    def _note_best(self, key: SweepKey, row: dict[str, Any]) -> None:
        if row["status"] == Status.OK.value and row.get("median_s"):
            cur = self.best.get(key.name)
            if cur is None or row["median_s"] < cur["median_s"]:
                self.best[key.name] = row

    # ---------------------------------------------------------------- submission
    def _executor(self, spec: TrialSpec):
        gpn = self.cfg.cluster.gpus_per_node
        gpus = gpn if self.cfg.cluster.device == "cuda" else 0
        if self.executor_name == "local":
            return dispatch.make_executor(self.exec_cfg, world_size=1, gpus_per_node=gpus or 1,
                                          tasks_per_node=1)
        ex = dispatch.make_executor(self.exec_cfg, world_size=spec.world_size,
                                    gpus_per_node=gpn if gpus else max(gpn, spec.world_size))
        if not gpus:
            ex.update_parameters(gpus_per_node=None)
        return ex

    def _args(self, spec: TrialSpec) -> tuple:
        if self.executor_name == "local":
            return (local_payload, spec, str(self.cfg.results_dir / "trials" / spec.trial_id))
        return (slurm_payload, spec)

    def fill(self) -> None:
        """Submit queued trials into free slots (the first batch as one job array)."""
        free = self.slots - len(self.running)
        batch: list[tuple[Work, int, TrialSpec]] = []
        while free > 0 and self.queue:
            work = self.queue.pop(0)
            number, trial_id, a2a = work.study.ask(work.cand.layout.a2a, work.key.slug)
            cand = next(c for c in work.kept if c.layout.a2a == a2a)
            spec = spec_for(self.cfg, cand, trial_id, self.progress_dir)
            batch.append((work, number, spec))
            free -= 1
        if not batch:
            return
        same_shape = len({s.world_size for _, _, s in batch}) == 1
        if len(batch) > 1 and same_shape:
            ex = self._executor(batch[0][2])
            fn = self._args(batch[0][2])[0]
            handles = dispatch.submit_array(ex, fn, [self._args(s)[1:] for _, _, s in batch])
        else:
            handles = []
            for _, _, spec in batch:
                fn, *args = self._args(spec)
                handles.append(dispatch.submit(self._executor(spec), fn, *args))
        for (work, number, spec), handle in zip(batch, handles):
            work.study.submitted(number, handle.job_id, handle.executor, str(handle.folder))
            self.running.append(Running(work.key, work.study, number, spec, handle))
            self.reporter.trial(spec, "submitted", f"job {handle.job_id}")

    # ---------------------------------------------------------------- collection
    def record(self, run: Running, result: TrialResult) -> None:
        result.job_id = result.job_id or run.handle.job_id
        if not result.log_path:
            result.log_path = str(dispatch.job_paths(run.handle)[1])
        row = trial_row(run.key, run.spec, result)
        self.store.add(row, run.key)
        values = (result.median_s, float(result.peak_mem_bytes or 0)) if result.median_s else None
        run.study.tell(run.number, result.status, values)
        self._note_best(run.key, row)
        self.summary.stored += 1
        if result.failure_class is FailureClass.ENVIRONMENT and self.queue:
            # the same software stack runs every trial: the rest would fail the same way
            self.summary.aborted = (
                f"stopped submitting after an environment failure ({result.error}); "
                f"{len(self.queue)} trial(s) not run: fix the environment and run the same "
                "command again to resume")
            self.queue.clear()
        s = result.status.value
        self.summary.by_status[s] = self.summary.by_status.get(s, 0) + 1
        label = failure_label(row)
        if label:
            _count(self.summary.failures, run.key, label)
        detail = f"median {result.median_s:.4g} s" if result.median_s else (result.error or "")
        if result.failure_class:
            detail = f"{result.failure_class.value}: {detail}"
        self.reporter.trial(run.spec, s, detail, best=self.best.get(run.key.name))

    def poll(self) -> None:
        outcomes = dispatch.poll_all([r.handle for r in self.running])
        still = []
        for run, out in zip(self.running, outcomes):
            if out.state == dispatch.JobState.DONE and isinstance(out.result, TrialResult):
                self.record(run, out.result)
            elif out.finished:
                self.record(run, failed_from_job(run.spec, out))
            else:
                if out.state.value != run.state:
                    run.state = out.state.value
                    self.reporter.trial(run.spec, run.state, f"job {run.handle.job_id}")
                if self.early_stop and self._prune(run):
                    continue
                still.append(run)
        self.running = still

    def _prune(self, run: Running) -> bool:
        steps = read_progress(run.spec.progress_path)
        if len(steps) >= run.spec.measure_steps:
            return False  # measuring is over: stopping now saves nothing, the result is coming
        if not should_prune(steps, self.best.get(run.key.name)):
            return False
        dispatch.cancel([run.handle])
        best = self.best[run.key.name]["median_s"]
        self.summary.pruned += 1
        self.summary.pruned_saved_steps += max(0, run.spec.measure_steps - len(steps))
        self.record(run, partial_result(
            run.spec, Status.PRUNED, steps,
            f"stopped early: fastest of {len(steps)} steps {min(steps):.4g} s > best median "
            f"{best:.4g} s beyond its noise",
        ))
        return True

    def cancel_all(self) -> None:
        """Ctrl-C: cancel every outstanding job and record it as cancelled."""
        dispatch.cancel([r.handle for r in self.running])
        for run in self.running:
            steps = read_progress(run.spec.progress_path)
            self.record(run, partial_result(run.spec, Status.CANCELLED, steps,
                                            "cancelled by the user (Ctrl-C)"))
        self.running = []

    # ---------------------------------------------------------------- the loop
    def run(self) -> SweepSummary:
        self.plan()
        self.reporter.start(len(self.queue) + len(self.running), self.summary)
        try:
            while self.queue or self.running:
                self.fill()
                self.poll()
                if self.running:
                    time.sleep(POLL_INTERVAL_S)  # orchestrator's polling cadence
        except KeyboardInterrupt:
            self.cancel_all()
            self.store.rebuild()
            raise
        finally:
            self.reporter.stop()
        self.store.rebuild()
        self.summary.recommendations = self.store.recommendations()
        return self.summary
