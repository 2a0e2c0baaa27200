"""Run trials on this machine and wait for them: the blocking form of the sweep's local path.

``run_local_batch(specs, workdir=...)`` submits exactly what a local sweep submits, the job
payload ``hcp_tune.job.payload.batch_payload`` under submitit's LocalExecutor with one task
per rank (``dispatch.make_executor``), waits for the job, and reads each trial's result the
way the sweep reads it (``trials.read_result``: rank 0's file, a peer's root cause merged
in; ``trials.failed_from_job`` for a trial the job ended without). ``hcp-tune trial``,
``scripts/gpu_check.sh`` and the tests use it. It never hangs and never raises for a trial
failure: past ``timeout_s`` (default: the trials' time limits plus start-up) the job is
cancelled, its processes end, and a trial without a result is FAILED (time_limit).

Logs: ``workdir/jobs/<job id>/<job id>_<rank>_log.{out,err}`` (submitit's); a result's
``log_path`` is rank 0's ``.err``, where tracebacks land. ``run_local_batch`` runs several
specs of one world size in the same processes (a batch; see ``job.entry.run_batch``).

Building a TrialSpec (the orchestrator's job; this module imports no torch)::

    model = ...                                # hcp_tune.config.model.ModelSpec (conf/model/*.yaml)
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
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Optional

from hcp_tune.config.settings import ExecutorConfig
from hcp_tune.engine import dispatch
from hcp_tune.job.payload import batch_payload
from hcp_tune.merge import rank_out_path
from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    TrialSpec,
    atomic_write_text,
    to_json,
)

STARTUP_S = 120.0  # imports (torch, Megatron-Core) and rendezvous on a loaded machine
END_WAIT_S = 60.0  # after a cancel: the controller stops every task (SIGINT, then SIGKILL)
POLL_S = 0.2


def default_executor() -> ExecutorConfig:
    """The ``executor=local`` group's defaults (conf/executor/slurm.yaml, name local)."""
    import yaml

    from hcp_tune.config import CONF_DIR

    data = yaml.safe_load((CONF_DIR / "executor" / "slurm.yaml").read_text())
    return ExecutorConfig.from_mapping(dict(data, name="local"))


def run_local(spec: TrialSpec, *, workdir: str | Path, timeout_s: Optional[float] = None,
              executor: Optional[ExecutorConfig] = None) -> TrialResult:
    """Run one trial as ``spec.world_size`` local processes; rank 0's result."""
    return run_local_batch([spec], workdir=workdir, timeout_s=timeout_s, executor=executor)[0]


def _wait(handle: dispatch.JobHandle, deadline: float) -> Optional[dispatch.JobOutcome]:
    """Poll until the job ended; None when ``deadline`` (monotonic) passed first."""
    while True:
        out = dispatch.poll(handle)
        if out.finished:
            return out
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def _cancel(handle: dispatch.JobHandle) -> dispatch.JobOutcome:
    dispatch.cancel([handle])
    out = _wait(handle, time.monotonic() + END_WAIT_S)
    return out or dispatch.JobOutcome(state=dispatch.JobState.CANCELLED)


def run_local_batch(specs: list[TrialSpec], *, workdir: str | Path,
                    timeout_s: Optional[float] = None,
                    executor: Optional[ExecutorConfig] = None) -> list[TrialResult]:
    """Run trials of one world size one after another in the same local processes.

    ``executor``: the ``executor`` group to take ``setup`` and ``python`` from (its name,
    folder and time limit are set here); default: the local executor's defaults. A spec
    without ``result_path`` gets ``workdir/<trial_id>.result.json``.
    """
    from hcp_tune.engine.trials import failed_from_job, read_result  # the sweep's own reading

    if not specs:
        raise ValueError("run_local_batch: no specs given")
    sizes = {s.world_size for s in specs}
    if len(sizes) != 1:
        raise ValueError(f"run_local_batch: specs need one world size, got {sorted(sizes)}; "
                         "run each world size as its own batch")
    world = sizes.pop()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    specs = [s if s.result_path else dataclasses.replace(
        s, result_path=str(workdir / f"{s.trial_id}.result.json")) for s in specs]
    for s in specs:  # a result from an earlier run must not pass for this one's
        for r in range(world):
            rank_out_path(Path(s.result_path), r).unlink(missing_ok=True)
    limit = timeout_s if timeout_s is not None else sum(s.time_limit_s for s in specs) + STARTUP_S
    cfg = dataclasses.replace(
        executor or default_executor(), name="local", folder=str(workdir / "jobs"),
        # the executor's own limit is the backstop behind ours
        time_limit_min=math.ceil((limit + END_WAIT_S) / 60))
    gpus = 0 if specs[0].device == "cpu" else world
    ex = dispatch.make_executor(cfg, world_size=world, gpus_per_node=gpus)
    start = time.monotonic()
    handle = dispatch.submit(ex, batch_payload, specs)
    try:
        out = _wait(handle, start + limit)
    except BaseException:  # Ctrl-C: the job's processes end with us
        _cancel(handle)
        raise
    timed_out = out is None
    if timed_out:
        out = _cancel(handle)
    wall = time.monotonic() - start
    returned = out.result if out.state == dispatch.JobState.DONE else None
    by_id = {r.trial_id: r for r in (returned or []) if isinstance(r, TrialResult)}
    log = str(dispatch.job_paths(handle)[1])
    results = []
    for s in specs:
        res = read_result(s) or by_id.get(s.trial_id)
        if res is None and timed_out:
            res = TrialResult(
                trial_id=s.trial_id, status=Status.FAILED, world_size=world,
                failure_class=FailureClass.TIME_LIMIT,
                error=(f"time limit: {limit:.0f}s passed before the trial ended; cancelled "
                       f"job {handle.job_id} and its {world} processes (see {log})"))
        elif res is None:
            res = failed_from_job(s, out)
        res.job_id = res.job_id or handle.job_id
        res.log_path = res.log_path or log
        res.wall_s = res.wall_s if res.wall_s is not None else wall
        atomic_write_text(s.result_path, to_json(res))
        results.append(res)
    return results
