"""The Bridge step of ``scripts/gpu_check.sh``: two short Megatron-Bridge training runs.

A small Llama-shaped model (Llama-3-8B's layer: hidden 4096, 32 heads, 8 KV heads, SwiGLU
14336, vocab 128256; 2 layers so it fits on any 4 GPUs), cp=4, as ``[2,2]`` a2a+p2p and
its pure-ring baseline ``[1,4]``, each its own set of processes (a Bridge trial runs one
per process: job/bridge_runner.py). One verdict line per run: CP proven active at train
start (every TE attention module holds the planned groups), TFLOP/s under the profile's
peak, the median step and the first and last ``lm loss``. GPU only: ``--cpu`` prints that
the step was skipped and why.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from hcp_tune.spec import TrialResult, TrialSpec

LAYOUTS = ((2, 2), (1, 4))
MODEL, LAYERS, SEQ = "llama3-8b", 2, 8192
SKIPPED = ("gpu-check bridge: skipped (cpu mode): the Bridge step needs >= 4 GPUs and "
           "Megatron-Bridge with Transformer Engine")


def build_specs(cluster: str, progress_dir: Path, seq: int = SEQ) -> list[TrialSpec]:
    """The two Bridge trials, built the way a sweep builds them."""
    from hcp_tune import config
    from hcp_tune.engine.trialspec import spec_for
    from hcp_tune.space import plan

    cfg = config.load(["cp=4", f"seq={seq}", "tp=1", f"model={MODEL}", f"cluster={cluster}",
                       "runner=bridge", "dtype=bf16"])
    cands = {(c.layout.a2a, c.layout.p2p): c for c in plan.candidates(cfg)}
    return [dataclasses.replace(
        spec_for(cfg, cands[(a, p)], f"gpu-check-bridge-{a}x{p}", progress_dir),
        layers=LAYERS, warmup_steps=3, measure_steps=5, progress_path=None)
        for a, p in LAYOUTS]


def verdict(spec: TrialSpec, res: TrialResult) -> tuple[bool, str]:
    """(passed, one line) for one Bridge run."""
    problems, parts = [], []
    cp = res.verification.get("cp_active") or {}
    if cp.get("checked") and not cp.get("problems"):
        found = (cp.get("found") or [""])[0]
        parts.append(f"CP active ({found.split(';')[0]})" if found else "CP active")
    else:
        parts.append("CP NOT proven")
        problems.append((cp.get("problems") or [res.error or "CP-active check did not run"])[0])
    if res.median_s:
        parts.append(f"median step {res.median_s:.4g} s")
    if res.tflops_per_gpu is not None:
        peak = spec.peak_tflops
        parts.append(f"{res.tflops_per_gpu:.4g} TFLOP/s/GPU "
                     + (f"<= peak {peak:g}" if peak else "(no peak in this profile)"))
        if peak and res.tflops_per_gpu > peak:
            problems.append(res.error or "TFLOP/s above the peak")
    losses = [x for x in res.verification.get("lm_loss") or [] if x is not None]
    if losses:
        parts.append(f"lm loss {losses[0]:.4g} -> {losses[-1]:.4g}")
        if not all(math.isfinite(x) for x in losses):
            problems.append("lm loss is not finite")
    from hcp_tune.gpucheck.attention import verdict_line

    return verdict_line(f"gpu-check bridge [{spec.a2a},{spec.p2p}] {spec.comm_type}", res,
                        parts, problems)


def run(cluster: str, workdir: Path) -> list[tuple[bool, str]]:
    """Run both trials (each in its own processes) and return their verdicts."""
    from hcp_tune.engine.launch import run_local

    specs = build_specs(cluster, workdir / "progress")
    return [verdict(s, run_local(s, workdir=workdir / s.trial_id)) for s in specs]
