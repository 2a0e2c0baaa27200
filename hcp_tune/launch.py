"""The local launcher: run a trial as N processes on this machine, without SLURM.

``run_local(spec, workdir=...)`` starts ``spec.world_size`` processes of
``python -m hcp_tune.job.entry`` with the variables the job reads (``HCP_TUNE_LAUNCHER=local``,
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), waits for them,
and returns rank 0's TrialResult. It never hangs and never raises for a trial failure: past
the time limit every process is killed and a FAILED result (time_limit) comes back; a rank
that dies without a result is classified from its log. Per-rank logs are
``workdir/rank<r>.log``; the result's ``log_path`` points at rank 0's. It is a plain
function of picklable arguments, so a submitit local executor can run it as its payload.

Building a TrialSpec (the orchestrator's job; this module imports no torch)::

    model = ...                                # hcp_tune.model.ModelSpec (conf/model/*.yaml)
    layout = Layout(a2a=2, p2p=2)
    spec = TrialSpec(
        trial_id="tiny-cp4-2x2", a2a=layout.a2a, p2p=layout.p2p, tp=1, seq=512,
        heads=model.heads, kv_heads=model.kv_heads, head_dim=model.head_dim,
        hidden=model.hidden, layers=model.layers, vocab=model.vocab,
        warmup_steps=2, measure_steps=5, dtype="bf16",   # the CPU reference runs fp32
        expected_groups=rank_groups(layout, tp=1, gpus_per_node=8).as_dict(),
        peak_tflops=cluster_peak_tflops,          # a faster measurement is invalid
    )
    result = run_local(spec, workdir="results/trials/tiny-cp4-2x2")

``run_local_batch`` runs several specs of one world size in the same processes (groups
torn down between trials), which saves the start-up (torch + Megatron-Core imports).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

# both import only the standard library at module level (torch is imported inside the job)
from hcp_tune.job.dist import free_port
from hcp_tune.job.entry import merge_root_cause, rank_out_path
from hcp_tune.spec import (
    FailureClass, Status, TrialResult, TrialSpec, atomic_write_text, classify_error_text,
    first_error_line, result_from_json, to_json,
)

STARTUP_S = 120.0  # imports (torch, Megatron-Core) and rendezvous on a loaded machine
GRACE_S = 15.0  # after one rank died: time for the others to see it and write results
RANK0_DONE_GRACE_S = 5.0  # after rank 0 exited: its result is in; others only add a cause
POLL_S = 0.1
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*")


def _project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _log_error(log: Path) -> Optional[str]:
    """The last exception line of a rank's log (Python prints the cause last)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [ln.strip() for ln in lines if _ERROR_LINE.match(ln.strip())]
    return first_error_line(found[-1]) if found else None


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the rank and its children
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def run_local(spec: TrialSpec, *, workdir: str | Path, timeout_s: Optional[float] = None
              ) -> TrialResult:
    """Run one trial as ``spec.world_size`` local processes; rank 0's result."""
    return run_local_batch([spec], workdir=workdir, timeout_s=timeout_s)[0]


def local_payload(spec: TrialSpec, workdir: str) -> TrialResult:
    """The local executor's job: one task that starts the trial's ranks as local processes.
    (Here, not in the orchestrator's modules: a job imports what defines its payload.)"""
    return run_local(spec, workdir=workdir)


def local_batch_payload(specs: list[TrialSpec], workdir: str) -> list[TrialResult]:
    """The local executor's batch job: the batch's ranks as local processes, each trial's
    result written to its ``result_path`` the moment it ends (the job side does that)."""
    return run_local_batch(specs, workdir=workdir)


def run_local_batch(specs: list[TrialSpec], *, workdir: str | Path,
                    timeout_s: Optional[float] = None) -> list[TrialResult]:
    """Run trials of one world size one after another in the same local processes."""
    if not specs:
        raise ValueError("run_local_batch: no specs given")
    sizes = {s.world_size for s in specs}
    if len(sizes) != 1:
        raise ValueError(f"run_local_batch: specs need one world size, got {sorted(sizes)}; "
                         "run each world size as its own batch")
    world = sizes.pop()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    args, outs = [], []
    for spec in specs:
        spec_path = workdir / f"{spec.trial_id}.spec.json"
        out = Path(spec.result_path) if spec.result_path else workdir / f"{spec.trial_id}.result.json"
        atomic_write_text(str(spec_path), to_json(spec))
        for r in range(world):
            rank_out_path(out, r).unlink(missing_ok=True)
        args += [str(spec_path), str(out)]
        outs.append(out)
    limit = timeout_s if timeout_s is not None else sum(s.time_limit_s for s in specs) + STARTUP_S
    port = free_port()
    base = dict(os.environ)
    base.update(HCP_TUNE_LAUNCHER="local", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(world), HCP_TUNE_JOB_ID=f"local-{port}")
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [_project_root(), base.get("PYTHONPATH")]))
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    procs, logs = [], []
    start = time.monotonic()
    for r in range(world):
        log = workdir / f"rank{r}.log"
        logs.append(log)
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r), HCP_TUNE_LOG=str(log))
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "hcp_tune.job.entry", *args], stdout=fh,
                stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True))
    deadline = start + limit
    shortened = False  # the deadline was cut because a rank died or rank 0 finished
    timed_out = False
    comm_timeout = max(s.comm_timeout_s for s in specs)
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > deadline:
            timed_out = True
            break
        if any(p.returncode not in (None, 0) for p in procs) and not shortened:
            # one died: the rest get the comm timeout to notice it and write their results
            deadline, shortened = min(deadline, now + comm_timeout + GRACE_S), True
        if procs[0].returncode is not None:  # rank 0 is done: don't wait on a hung rank
            deadline, shortened = min(deadline, now + RANK0_DONE_GRACE_S), True
        time.sleep(POLL_S)
    _kill(procs)
    wall = time.monotonic() - start
    codes = [p.returncode for p in procs]
    return [_collect(spec, out, world, logs, codes, timed_out and not shortened, limit, wall)
            for spec, out in zip(specs, outs)]


def _collect(spec, out, world, logs, codes, timed_out, limit, wall) -> TrialResult:
    per_rank = {}
    for r in range(world):
        path = rank_out_path(out, r)
        if path.exists():
            per_rank[r] = result_from_json(path.read_text())
    res = per_rank.get(0)
    if res is not None:
        merge_root_cause(res, out, world)
        dead = [r for r in range(world) if r not in per_rank]
        if dead and res.status == Status.FAILED:
            res.error = f"{res.error}; ranks {dead} exited with codes {[codes[r] for r in dead]}"
    else:
        res = TrialResult(trial_id=spec.trial_id, status=Status.FAILED, world_size=world)
        if timed_out:
            res.failure_class = FailureClass.TIME_LIMIT
            res.error = (f"time limit: the launcher's limit of {limit:.0f}s passed; "
                         f"killed {world} processes (see {logs[0]})")
        else:
            err = _log_error(logs[0]) or next(filter(None, (_log_error(l) for l in logs)), None)
            res.error = err or f"rank 0 wrote no result; exit codes {codes}"
            res.failure_class = classify_error_text(res.error)
    res.log_path = str(logs[0])
    res.wall_s = res.wall_s if res.wall_s is not None else wall
    atomic_write_text(str(out), to_json(res))
    return res
