"""A job's body on one rank: several trials in the same processes (``run_trials``), each
result written the moment it ends, and what ends a job whose ranks did not all finish.

A job (``job.payload.batch_payload``, under submitit's local executor or SLURM alike) runs
``run_batch`` on every rank: its trials one after another in the same processes (the world
group built once, a layout's groups kept while the next trial has the same layout, its
proof run once); after a FAILED trial the rest are SKIPPED, since the process group may be
broken. Each trial's result is written the moment it ends: rank 0 writes ``result_path``;
rank r > 0 writes ``<stem>.rank<r>.json`` beside it (``hcp_tune.merge``). What ends a job
whose ranks did not all finish, on both executors: a hung peer ends itself shortly after
rank 0's task ended; past the job's time limit the executor kills every task.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from hcp_tune.job.trial import ProcessSet, _layout_key, run_trial
from hcp_tune.merge import rank_out_path
from hcp_tune.spec import Status, TrialResult, TrialSpec, atomic_write_text, to_json

PEER_FILES_WAIT_S = 10.0  # rank 0, after a failed trial: how long it waits for peers' files
PEER_LINGER_S = 10.0  # a peer still running this long after rank 0's task ended exits
POLL_S = 0.2


def run_trials(specs: list[TrialSpec], on_result: Optional[Callable[[TrialResult], None]] = None
               ) -> list[TrialResult]:
    """Several trials in the same processes; after a FAILED one the rest are SKIPPED.

    The world group is created once, with the first trial's ``comm_timeout_s``; a layout's
    groups are built once for consecutive trials of that layout (order the specs by layout
    to profit) and its proof runs once per process set. ``on_result`` gets each trial's
    result the moment it ends (the batch payloads write it to ``spec.result_path``), so a
    batch killed half-way keeps what it measured. A FAILED trial may leave the processes
    unusable, so the rest come back SKIPPED ("not run") for the orchestrator to requeue.
    """
    out: list[TrialResult] = []
    broken: Optional[TrialResult] = None
    pset = ProcessSet()
    bridge_ran: Optional[str] = None
    for i, spec in enumerate(specs):
        if spec.runner == "bridge" and bridge_ran is not None:
            res = TrialResult(  # bridge_runner.py: Bridge sets up global state per run
                trial_id=spec.trial_id, status=Status.SKIPPED, world_size=spec.world_size,
                error=f"not run: Bridge trials run one per process ({bridge_ran} ran here)")
            out.append(res)
            if on_result is not None:
                on_result(res)
            continue
        if spec.runner == "bridge":
            bridge_ran = spec.trial_id
        if broken is not None:
            res = TrialResult(
                trial_id=spec.trial_id, status=Status.SKIPPED, world_size=spec.world_size,
                error=f"not run: trial {broken.trial_id} failed before it in the same processes")
        else:
            nxt = specs[i + 1] if i + 1 < len(specs) else None
            same = nxt is not None and _layout_key(nxt) == _layout_key(spec)
            res = run_trial(spec, keep_process_group=True, pset=pset, keep_groups=same)
            if res.status == Status.FAILED:
                broken = res
        out.append(res)
        if on_result is not None:
            on_result(res)
    if broken is None:
        from hcp_tune.job.dist import destroy_distributed

        destroy_distributed()
    return out


def write_result(res: TrialResult, out: Path, rank: int) -> None:
    """This rank's result file for one trial (rank 0's is the one the orchestrator reads)."""
    atomic_write_text(str(rank_out_path(out, rank)), to_json(res))


def _share_cpus(env) -> None:
    """The ranks on a node share its cores: without a bound every rank starts a thread per
    core, and CPU trials measure the oversubscription (2 ranks x 2 threads on 2 cores ran
    the same steps 4-8x slower). Threads per rank: ``SLURM_CPUS_PER_TASK`` when SLURM gave
    each task its CPUs, else the cores this process may use over the ranks on its node.
    ``OMP_NUM_THREADS`` set by the user wins. Before torch loads (else torch is told)."""
    if env.source == "single" or "OMP_NUM_THREADS" in os.environ:
        return
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        threads = int(per_task)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        on_node = max(1, env.world_size // max(1, len(env.hosts)))
        threads = max(1, (cores or 1) // on_node)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def _end_with_rank0(env) -> None:
    """A peer (rank > 0) that is still running ``PEER_LINGER_S`` after rank 0's task ended is
    hung (rank 0 has its results): it exits, so the job ends on either executor. Rank 0's
    end is submitit's result file of task 0 (written when its payload returned or raised)."""
    from hcp_tune.job.dist import task_paths

    task0 = task_paths(env.job_id, 0)
    if task0 is None:
        return
    marker = task0.result_pickle

    def watch() -> None:
        while not marker.exists():
            time.sleep(POLL_S * 5)
        deadline = time.monotonic() + PEER_LINGER_S
        while time.monotonic() < deadline:  # a normal end exits the process meanwhile
            time.sleep(POLL_S)
        print(f"[rank {env.rank}] still running {PEER_LINGER_S:.0f}s after rank 0's task "
              "ended: exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="hcp-tune-end-with-rank0", daemon=True).start()


def _wait_for_peer_files(specs: list[TrialSpec], results: list[TrialResult], world: int) -> None:
    """Rank 0, after a FAILED trial: give the peers a moment to write their result files, so
    that ``merge_root_cause`` (when the orchestrator reads the result) sees a peer's cause."""
    for spec, res in zip(specs, results):
        if res.status != Status.FAILED or not spec.result_path:
            continue
        paths = [rank_out_path(Path(spec.result_path), r) for r in range(1, world)]
        deadline = time.monotonic() + PEER_FILES_WAIT_S
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(POLL_S)


def _exit_without_teardown() -> None:
    """At interpreter exit, skip the teardown: after a failure the process group may be
    broken, and destroying it can wait on a peer that is gone. (Job processes only: submitit
    has written the task's result by then.)"""
    import atexit
    import logging

    def leave() -> None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    atexit.register(leave)


def run_batch(specs: list[TrialSpec], *, note: str = "", log_path: str = ""
              ) -> list[TrialResult]:
    """A job's body on one rank, for both executors: each result written to its
    ``result_path`` at once; a hung peer ends with rank 0 (``_end_with_rank0``).
    ``note``: added to every result (``job.pool``: which process set of which allocation
    ran it); ``log_path``: this rank's log, where a result without one points."""
    from hcp_tune.job.dist import detect_env

    env = detect_env()
    _share_cpus(env)
    if env.rank != 0:
        _end_with_rank0(env)
    by_id = {s.trial_id: s for s in specs}

    def write(res: TrialResult) -> None:
        if note:
            res.notes.append(note)
        res.log_path = res.log_path or log_path or None
        path = by_id[res.trial_id].result_path
        if path:
            write_result(res, Path(path), env.rank)
        print(f"[rank {env.rank}] {res.trial_id}: {res.status.value}"
              + (f" ({res.failure_class.value}) {res.error}" if res.failure_class else
                 f" {res.error}" if res.error else ""), flush=True)

    results = run_trials(specs, on_result=write)
    if any(r.status == Status.FAILED for r in results):
        if env.rank == 0:
            _wait_for_peer_files(specs, results, env.world_size)
        if os.environ.get("SUBMITIT_EXECUTOR"):
            _exit_without_teardown()
    return results
