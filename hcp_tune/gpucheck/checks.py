"""What each first-session step checks, run inside that step's own process (``session``).

Each function takes the step's context and its trials and returns one line: (passed,
text). A Bridge run goes through ``engine.launch.run_local`` (its own processes, bounded by
the session's deadline), except ``gpu_per_task``, which starts four job-entry processes
that each see one GPU, as ``srun --gpus-per-task=1`` would.
"""
from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

from hcp_tune.job.dist import quiet_ports
from hcp_tune.spec import Status, TrialResult, TrialSpec

Line = tuple[bool, str]
MARGIN_S = 15.0  # a run ends this long before the session's deadline


def stack_missing() -> Optional[str]:
    from hcp_tune.job.bridge.runner import missing_stack

    return missing_stack()


def _left(ctx) -> Optional[float]:
    return None if ctx.deadline is None else max(1.0, ctx.deadline - time.monotonic() - MARGIN_S)


def run_all(ctx, specs: list[TrialSpec]) -> list[TrialResult]:
    from hcp_tune.engine.launch import run_local

    return [run_local(s, workdir=ctx.workdir / s.trial_id,
                      timeout_s=min(s.time_limit_s + 120, _left(ctx) or 1e9)) for s in specs]


def describe(res: TrialResult) -> str:
    """A run in a few words: status, median, peak memory and retries, host RSS, error."""
    rss = res.verification.get("host_peak_rss_bytes")
    retries = sum(m.get("alloc_retries") or 0 for m in res.verification.get("memory") or [])
    transport = (res.fingerprint or {}).get("nccl_transport")
    return (res.status.value + (f", median step {res.median_s:.4g} s" if res.median_s else "")
            + (f", peak {res.peak_mem_bytes / 2**30:.1f} GiB ({retries} allocator retries)"
               if res.peak_mem_bytes else "")
            + (f", host RSS {rss / 2**30:.1f} GiB" if rss else "")
            + (f", NCCL {'+'.join(transport)}" if transport else "")
            + (f" ({res.error[:160]})" if res.error else ""))


def imports(ctx, _specs) -> Line:
    import torch

    found = []
    for mod in ("transformer_engine", "megatron.core", "megatron.bridge"):
        try:
            with warnings.catch_warnings():  # Megatron-Core warns without TE or Apex
                warnings.simplefilter("ignore")
                version = getattr(importlib.import_module(mod), "__version__", "?")
            found.append(f"{mod} {version}")
        except Exception as e:  # missing, or broken on import
            found.append(f"{mod} missing" if isinstance(e, ImportError) else
                         f"{mod} broken ({type(e).__name__})")
    ok = not any(" missing" in f or " broken" in f for f in found)
    return ok, f"torch {torch.__version__} (CUDA {torch.version.cuda}); " + ", ".join(found)


def one_gpu(ctx, _specs) -> Line:
    from hcp_tune.gpucheck import single

    lines = [single.in_child("binding"), single.in_child("te")]
    return all(ok for ok, _ in lines), " | ".join(t.split(": ", 1)[-1] for _, t in lines)


def log_medians(folder: Path, warmup: int) -> list[float]:
    """Bridge's own "elapsed time per iteration" of every log under ``folder``, after the
    warm-up (``measure.parse_log``)."""
    from hcp_tune.job.bridge.measure import parse_log

    text = "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*"))
                     if p.is_file() and p.suffix in (".log", ".out", ".err"))
    return parse_log(text, warmup_steps=warmup, world_size=1).step_times_s


def recorder_vs_log(ctx, spec: TrialSpec, res: TrialResult) -> Line:
    """The recorder's median against Bridge's logged iteration time: the recorder times
    train_step alone, Bridge's timer the whole loop body with a barrier, so at most 10%
    below it and never above."""
    if not res.median_s:
        return False, "recorder vs log: no measured run"
    logged = log_medians(ctx.workdir / spec.trial_id, spec.warmup_steps)
    if not logged:
        return False, "recorder vs log: Bridge's iteration lines not found in the logs"
    ref = statistics.median(logged)
    gap = res.median_s / ref - 1
    return -0.10 <= gap <= 0.02, (f"recorder {res.median_s:.4g} s vs Bridge's elapsed time per "
                                  f"iteration {ref:.4g} s ({gap:+.1%}; expected -10%..+2%)")


def mask_off(ctx, specs: list[TrialSpec]) -> Line:
    (spec,), (res,) = specs, run_all(ctx, specs)
    rec_ok, rec = recorder_vs_log(ctx, spec, res)
    return res.status is Status.OK and rec_ok, f"mask off (the runner's): {describe(res)}; {rec}"


def mask_on(ctx, specs: list[TrialSpec]) -> Line:
    """It passes when it ran: what it costs is the figure to read (an OOM of the host at
    32K is itself the finding the runner's mask-off setting avoids)."""
    (res,) = run_all(ctx, specs)
    return res.status is Status.OK, f"mask on (Megatron-Core's default): {describe(res)}"


def fit_line(specs: list[TrialSpec], results: list[TrialResult]) -> Line:
    from hcp_tune.engine.trials import points_fit

    bad = [r for r in results if r.status is not Status.OK or not r.median_s]
    if bad:
        return False, f"a run did not measure: {describe(bad[0])}"
    fit = points_fit(specs, results)
    reason = fit.linearity()
    res = ", ".join(f"{r:+.3g}" for r in fit.residuals_s())
    return (reason is None and fit.per_micro_batch_s > 0,
            f"m={[s.micro_batches for s in specs]}: step = {fit.fixed_s:.4g} s + "
            f"{fit.per_micro_batch_s:.4g} s * m, residuals {res} s"
            + (f" -- {reason}" if reason else " (a line within the noise)"))


def fit(ctx, specs: list[TrialSpec]) -> Line:
    return fit_line(specs, run_all(ctx, specs))


def _cp_line(spec: TrialSpec, res: TrialResult) -> Line:
    from hcp_tune.gpucheck.bridge import verdict

    ok, text = verdict(spec, res)
    return ok, text.split(": ", 1)[-1] + f"; {describe(res)}"


def guard(ctx, specs: list[TrialSpec]) -> Line:
    lines = [_cp_line(s, r) for s, r in zip(specs, run_all(ctx, specs))]
    return all(ok for ok, _ in lines), " | ".join(
        f"[{s.a2a},{s.p2p}] {t}" for s, (_, t) in zip(specs, lines))


def one_run(ctx, specs: list[TrialSpec]) -> Line:
    """One measured run: CP proven, TFLOP/s under the peak, with what the runner recorded
    before CUDA (CUDA_DEVICE_MAX_CONNECTIONS) and where the ranks ran."""
    (spec,), (res,) = specs, run_all(ctx, specs)
    ok, text = _cp_line(spec, res)
    settings = (res.fingerprint or {}).get("settings") or {}
    place = res.verification.get("placement") or {}
    extra = (f"; CUDA_DEVICE_MAX_CONNECTIONS={settings.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}"
             f", placement {'block' if place.get('block') else place.get('problems') or '?'}")
    notes = [n for n in res.notes if n.startswith("recipe env_vars")]
    return ok, text + extra + (f"; {notes[0]}" if notes else "")


def negatives(ctx, specs: list[TrialSpec]) -> Line:
    """A misconfiguration must never end ok: Bridge's validation or the guard stops it."""
    parts, ok = [], True
    for spec, res in zip(specs, run_all(ctx, specs)):
        caught = res.status is not Status.OK
        ok &= caught
        parts.append(f"{' '.join(spec.bridge_overrides)}: {res.status.value}"
                     f"{' (caught)' if caught else ' -- NOT caught'} {(res.error or '')[:120]}")
    return ok, " | ".join(parts)


def gpu_per_task(ctx, specs: list[TrialSpec]) -> Line:
    """Four job-entry processes, task r seeing only GPU r of the step's, as srun
    --gpus-per-task=1 starts them: each binds cuda:0 and Bridge must be told so."""
    import dataclasses

    from hcp_tune.spec import result_from_json, to_json

    (spec,) = specs
    folder = ctx.workdir / spec.trial_id
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "result.json"
    (folder / "spec.json").write_text(to_json(dataclasses.replace(spec, result_path=str(out))))
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
    if len(visible) < spec.world_size:
        return False, f"needs {spec.world_size} visible GPUs, has {visible}"
    base = {**os.environ, "WORLD_SIZE": str(spec.world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(quiet_ports()), "HCP_TUNE_LOG": str(folder / "rank0.log")}
    procs = []
    for r in range(spec.world_size):
        with open(folder / f"rank{r}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "hcp_tune.job.entry", str(folder / "spec.json"), str(out)],
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r),
                     "CUDA_VISIBLE_DEVICES": visible[r]}, stdout=log, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=_left(ctx) or spec.time_limit_s + 120)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return False, "the four tasks did not end before the deadline"
    if not out.exists():
        return False, f"no result (exit codes {[p.returncode for p in procs]}; logs in {folder})"
    res = result_from_json(out.read_text())
    told = res.verification.get("bridge_config", {}).get("dist.external_gpu_device_mapping")
    ok, text = _cp_line(spec, res)
    return ok and told is True, (f"dist.external_gpu_device_mapping={told}; " + text)

