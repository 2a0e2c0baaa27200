"""A check of the GPU path anyone can run: ``scripts/gpu_check.sh [--cpu]``.

On a node with >= 4 GPUs and Transformer Engine: cp=4 trials of [4,1], [2,2] and [1,4]
with the TE backend, in one set of processes (so the teardown between trials is exercised
too), and one verdict line per layout: the groups Megatron-Core built match the plan, the
numerics proof passed (CP run against the no-CP run in the same dtype), the achieved
TFLOP/s stay under the profile's peak, and the backend ran (with the kernel TE selected).
``--cpu`` runs the same trials with the pure-torch reference on gloo (model tiny, a small
sequence, bf16, so the proof is the same same-dtype comparison) and prints the same lines.
Then, on GPUs, the Bridge step (``gpucheck_bridge``: a [2,2] trial and its [1,4] baseline
as short Megatron-Bridge runs, one line each; ``--no-bridge`` skips it); ``--cpu`` says
it was skipped.
Exit 0 when every layout passes, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hcp_tune.spec import Status, TrialResult, TrialSpec

CP = 4
LAYOUTS = ((4, 1), (2, 2), (1, 4))  # [a2a, p2p]: pure a2a, hierarchical, pure ring


@dataclass(frozen=True)
class Mode:
    """What one mode runs: the profile, the workload and the backend it expects."""

    name: str
    cluster: str
    model: str
    seq: int
    backend: str
    dtype: str = "bf16"


GPU = Mode("gpu", cluster="dgx-h100", model="llama3-8b", seq=16384, backend="te")
CPU = Mode("cpu", cluster="local", model="tiny", seq=256, backend="torch")


def build_specs(mode: Mode, progress_dir: Path) -> list[TrialSpec]:
    """The three layouts' trials, built the way a sweep builds them."""
    from hcp_tune import config, plan
    from hcp_tune.errors import ConfigError
    from hcp_tune.sweep import spec_for

    cfg = config.load([f"cp={CP}", f"seq={mode.seq}", "tp=1", f"model={mode.model}",
                       f"cluster={mode.cluster}", "runner=attention", f"dtype={mode.dtype}"])
    cands = {(c.layout.a2a, c.layout.p2p): c for c in plan.candidates(cfg)}
    specs = []
    for a2a, p2p in LAYOUTS:
        cand = cands[(a2a, p2p)]
        if not cand.kept:
            raise ConfigError(f"layout [{a2a},{p2p}] is rejected for model={mode.model} "
                              f"seq={mode.seq}: {cand.reasons[0]}")
        spec = spec_for(cfg, cand, f"gpu-check-{mode.name}-{a2a}x{p2p}", progress_dir)
        # the sweep's CPU default is fp32; the check proves in bf16 on both, as TE would run
        specs.append(dataclasses.replace(spec, backend=mode.backend, dtype=mode.dtype,
                                         warmup_steps=2, measure_steps=3, progress_path=None))
    return specs


def verdict(spec: TrialSpec, res: TrialResult, mode: Mode) -> tuple[bool, str]:
    """(passed, one line) for one layout."""
    problems, parts = [], []
    groups = res.verification.get("groups", {})
    parts.append("groups " + ("match" if groups.get("match") else "DIFFER"))
    if not groups.get("match"):
        problems.append((groups.get("problems") or ["groups not checked"])[0])
    num = res.verification.get("numerics")
    if num:
        worst = max(num["errors"].values())
        parts.append(f"numerics {'pass' if num['passed'] else 'FAIL'} (worst {worst:.2g} "
                     f"<= {num['tolerance']:.2g}, vs {num.get('reference', 'float64')})")
        if not num["passed"]:
            problems.append(res.error or "numerics failed")
    else:
        parts.append("numerics not run")
    if res.tflops_per_gpu is not None:
        peak = spec.peak_tflops
        parts.append(f"{res.tflops_per_gpu:.3g} TFLOP/s/GPU " + (
            f"<= peak {peak:g}" if peak else "(no peak in this profile)"))
        if peak and res.tflops_per_gpu > peak:
            problems.append(res.error or "TFLOP/s above the peak")
    kernel = f": {res.te_backend}" if res.te_backend else ""
    parts.append(f"backend {res.backend or '?'}{kernel}")
    if res.backend and res.backend != mode.backend:
        problems.append(f"backend {res.backend} ran, {mode.backend} was expected")
    if mode.backend == "te" and res.backend == "te" and not res.te_backend:
        problems.append("TE's selected backend was not recorded (NVTE_DEBUG log not seen)")
    return verdict_line(f"gpu-check [{spec.a2a},{spec.p2p}] {spec.comm_type}", res, parts,
                        problems)


def verdict_line(label: str, res: TrialResult, parts: list[str], problems: list[str]
                 ) -> tuple[bool, str]:
    """PASS when the trial is ok and no check found a problem; else FAIL with the first
    problem (the trial's own status and error when no check named one)."""
    if res.status != Status.OK and not problems:
        cls = f" ({res.failure_class.value})" if res.failure_class else ""
        problems.append(f"{res.status.value}{cls}: {res.error}")
    ok = res.status == Status.OK and not problems
    line = (f"{label}: {'PASS' if ok else 'FAIL'}  " + " | ".join(parts)
            + ("" if ok else f"  -- {problems[0]}"))
    return ok, line


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true",
                    help="the torch reference on gloo (model tiny), no GPU needed")
    ap.add_argument("--cluster", help="profile whose peak bounds the TFLOP/s "
                    f"(default {GPU.cluster}; {CPU.cluster} with --cpu)")
    ap.add_argument("--seq", type=int, help=f"sequence length (default {GPU.seq}; "
                    f"{CPU.seq} with --cpu)")
    ap.add_argument("--workdir", help="where the ranks' logs go (default: a new temp folder)")
    ap.add_argument("--no-bridge", action="store_true",
                    help="skip the Bridge step (two short Megatron-Bridge runs; GPU mode only)")
    args = ap.parse_args(argv)
    mode = CPU if args.cpu else GPU
    mode = dataclasses.replace(mode, cluster=args.cluster or mode.cluster,
                               seq=args.seq or mode.seq)
    if mode.name == "gpu" and gpu_count() < CP:
        print(f"gpu-check: needs >= {CP} GPUs visible to torch, found {gpu_count()} "
              "(run with --cpu to check the same path with the torch reference)")
        return 1
    from hcp_tune.errors import ConfigError
    from hcp_tune.launch import run_local_batch

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hcp-gpu-check-")).resolve()
    try:
        specs = build_specs(mode, workdir / "progress")
    except ConfigError as e:
        print(f"gpu-check: error: {e}", file=sys.stderr)
        return 2
    layouts = ", ".join(f"[{a},{p}]" for a, p in LAYOUTS)
    print(f"gpu-check: {mode.name} mode: cp={CP} layouts {layouts}, backend {mode.backend}, "
          f"model {mode.model}, seq {mode.seq}, {mode.dtype}, profile {mode.cluster}; "
          f"logs in {workdir}", flush=True)
    results = run_local_batch(specs, workdir=workdir)
    verdicts = [verdict(spec, res, mode) for spec, res in zip(specs, results)]
    for _, line in verdicts:
        print(line, flush=True)
    from hcp_tune import gpucheck_bridge

    if mode.name == "cpu":
        print(gpucheck_bridge.SKIPPED, flush=True)
    elif not args.no_bridge:  # one verdict line per Bridge run (hcp_tune/gpucheck_bridge.py)
        for ok_line in gpucheck_bridge.run(mode.cluster, workdir / "bridge"):
            print(ok_line[1], flush=True)
            verdicts.append(ok_line)
    passed = sum(ok for ok, _ in verdicts)
    print(f"gpu-check: {passed}/{len(verdicts)} layouts pass")
    return 0 if passed == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
