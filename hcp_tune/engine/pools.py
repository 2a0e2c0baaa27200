"""The orchestrator's side of a kept allocation (``executor.keep_allocation``; the job's side
is ``job/pool.py``): which sweeps keep their allocations, a ``Pool`` per job that does, how
the next batch is handed to it, how a batch's end is read, and how a pool is let go.

A pool job runs its first batch as process set 0; while the sweep has queued trials of
its world size, each next batch goes to it as ``batch-<n>.json`` (a fresh process set of
the same allocation: no new submission, queue wait or container start), and a batch has
ended when its ``batch-<n>.done.json`` is there. A pool with nothing queued for it, or
without the time left for the next batch, is told to end (``end``), so an allocation is
never held idle while the sweep waits for other jobs.

What a repeat samples: every batch runs in new processes (world group, groups, CP proof,
warm-up), and a batch holds at most one trial of a layout and key (``Sweeper._take_batch``),
so a layout's repeats still run in different process sets; they share the allocation's
nodes. ``search.purpose=regress`` never keeps one: its spreads were recorded with every
repeat in a job of its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hcp_tune.engine import dispatch
from hcp_tune.job.pool import STARTUP_S, PoolFiles, read_done, write_specs
from hcp_tune.spec import TrialSpec

END_WAIT_S = 10.0  # at the sweep's end: how long to wait for ended pools' jobs to finish
END_POLL_S = 0.1
FAST_POLL_S = 0.05  # how often a sweep looks for a running process set's done file


def keeps_allocation(cfg: Any, *, steps: bool, synthetic: bool) -> bool:
    """Whether a sweep's jobs are pools: ``executor.keep_allocation``, for batches of one
    process set (``steps`` batches start each trial's processes themselves), never for
    ``search.purpose=regress`` or runner=synthetic (no jobs)."""
    return (cfg.executor.keep_allocation and cfg.search.purpose == "tune"
            and not steps and not synthetic)


def forks(cfg: Any, nodes: int) -> bool:
    """Whether a pool's driver starts its process sets by fork (``job.pool``): CPU trials,
    one node, no container (GPU trials' ranks start as new interpreters or srun steps)."""
    return cfg.cluster.device == "cpu" and nodes == 1 and not cfg.executor.container_image


@dataclass
class Pool:
    """A kept allocation: its job, its folder, the world size of its trials, and when its
    time limit ends (counted from its submission: its start is later, so this is early)."""

    handle: dispatch.JobHandle
    files: PoolFiles
    world_size: int
    deadline: float  # time.monotonic()
    sets: int = 1  # process sets handed to it (set 0 came with the job)
    unusable: bool = False  # its driver gave the allocation up

    def trials_that_fit(self, per_trial_s: float) -> int:
        """How many trials the rest of its time limit holds, at the most the driver lets a
        set take (``runner.time_limit_s`` a trial, plus ``job.steps.STARTUP_S``)."""
        left = self.deadline - time.monotonic() - STARTUP_S
        return max(0, int(left // max(1.0, per_trial_s)))


def new(handle: dispatch.JobHandle, root: Path, world_size: int, limit_s: float,
        submitted: float) -> Pool:
    return Pool(handle, PoolFiles(Path(root)), world_size, submitted + limit_s)


def root_for(results_dir: Path, first: TrialSpec) -> Path:
    """A pool's folder, named after its first trial (``trials/<trial>.pool``)."""
    return Path(results_dir) / "trials" / f"{first.trial_id}.pool"


def feed(pool: Pool, specs: list[TrialSpec]) -> int:
    """Hand the pool its next batch; the number of the process set that runs it."""
    n = pool.sets
    write_specs(pool.files.batch(n), specs)
    pool.sets += 1
    return n


def outcome(pool: Pool, n: int, job: dispatch.JobOutcome) -> dispatch.JobOutcome:
    """Process set n's end, as a job's outcome: its done file when there (an error when
    its processes did not all end well; the set's rank logs), else the job's outcome when
    the job ended first, else running (or pending)."""
    done = read_done(pool.files.done(n))
    if done is None:
        if job.finished:
            return job
        return dispatch.JobOutcome(state=job.state, scheduler_state=job.scheduler_state,
                                   stdout=job.stdout, stderr=job.stderr)
    pool.unusable = pool.unusable or bool(done.get("unusable"))
    log = Path(done.get("log") or pool.files.logs(n) / "rank0.log")
    if not done.get("error"):
        return dispatch.JobOutcome(state=dispatch.JobState.DONE, stdout=log, stderr=log)
    return dispatch.JobOutcome(state=dispatch.JobState.FAILED, error=done["error"],
                               scheduler_state="TIMEOUT" if done.get("timed_out") else "",
                               stdout=log, stderr=log)


def untaken(pool: Pool, n: int, job: dispatch.JobOutcome) -> bool:
    """The pool's driver returned before it took process set n (n >= 1: handed to it just
    as it saw its sweep's marker gone, or was idle too long): the set's trials never
    started. A job that failed or was cancelled is read as such (``outcome``)."""
    return (n > 0 and job.state == dispatch.JobState.DONE
            and not pool.files.logs(n).exists())


def wait_for_poll(running: Sequence[Any], interval_s: float) -> None:
    """Sleep until the sweep's next poll: ``interval_s``, or less once a running process
    set of a kept allocation has ended (its done file), so its next batch goes out at once
    instead of at the next tick (what each adaptive round's boundary would wait)."""
    done = [r.pool.files.done(r.set_n) for r in running if r.pool is not None]
    deadline = time.monotonic() + interval_s
    while time.monotonic() < deadline:
        if any(p.exists() for p in done):
            return
        time.sleep(FAST_POLL_S if done else interval_s)  # the polling cadence


def end(pools: Sequence[Pool]) -> None:
    """Tell pools there is no more work: each driver returns and its job ends."""
    for pool in pools:
        pool.files.root.mkdir(parents=True, exist_ok=True)
        pool.files.end.touch()


def release(pools: Sequence[Pool], wait_s: float = END_WAIT_S) -> None:
    """End pools and wait (at most ``wait_s``) for their jobs to finish, so the sweep
    leaves no allocation behind when it returns."""
    end(pools)
    deadline = time.monotonic() + wait_s
    handles = [p.handle for p in pools]
    while handles and time.monotonic() < deadline:
        handles = [h for h, o in zip(handles, dispatch.poll_all(handles)) if not o.finished]
        if handles:
            time.sleep(END_POLL_S)  # polling cadence
