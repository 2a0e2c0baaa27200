"""A check of the GPU path anyone can run: ``scripts/gpu_check.sh [--cpu]``.

On a node with >= 4 GPUs and Transformer Engine: cp=4 trials of [4,1], [2,2] and [1,4]
with the TE backend, in one set of processes (so the teardown between trials is exercised
too), and one verdict line per layout: the groups Megatron-Core built match the plan, the
numerics proof passed (CP run against the no-CP run in the same dtype), the achieved
TFLOP/s stay under the profile's peak, and the backend ran (with the kernel TE selected).
``--cpu`` runs the same trials with the pure-torch reference on gloo (model tiny, a small
sequence, bf16, so the proof is the same same-dtype comparison) and prints the same lines.
Then, on GPUs, the Bridge step (``gpucheck.bridge``: a [2,2] trial and its [1,4] baseline
as short Megatron-Bridge runs, one line each; ``--no-bridge`` skips it); ``--cpu`` says
it was skipped.
With 1-3 GPUs (or ``--one-gpu``) it runs what one GPU can check instead
(``gpucheck.single``: the device binding, TE's import and backend choice, a Bridge run at
cp=1 with the callbacks) and says what it could not check.
``--first-session`` runs the checks a first GPU session must run, in order
(``gpucheck.session``: imports, the one-GPU checks, a 32K Bridge run with and without the
S x S mask, the recorder against Bridge's log, the fit at m = 1, 3, 9; with 4-8 GPUs the
cp=4 guard, the misconfiguration negatives, pp=2 at m = 2, 6, 18 and one GPU per task);
``--dry`` walks that sequence on CPU, building every step's trials and printing what it
would run and what it proves.
Exit 0 when every layout passes, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Optional

from hcp_tune.gpucheck import bridge as gpucheck_bridge
from hcp_tune.gpucheck.attention import CP, CPU, GPU, LAYOUTS, build_specs, verdict


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
    ap.add_argument("--one-gpu", action="store_true",
                    help="what one GPU can check (binding, TE, Bridge at cp=1); the default "
                    f"with 1..{CP - 1} GPUs")
    ap.add_argument("--first-session", action="store_true",
                    help="the first GPU session's checks, in order (gpucheck.session)")
    ap.add_argument("--dry", action="store_true",
                    help="walk the first-session sequence on CPU: build every step, print "
                    "what it would run and prove")
    args = ap.parse_args(argv)
    if args.dry or args.first_session:
        return _first_session(args.cluster or GPU.cluster, args.workdir, dry=args.dry)
    mode = CPU if args.cpu else GPU
    mode = dataclasses.replace(mode, cluster=args.cluster or mode.cluster,
                               seq=args.seq or mode.seq)
    if mode.name == "gpu" and (args.one_gpu or 1 <= gpu_count() < CP):
        return _one_gpu(mode.cluster, args.workdir)
    if mode.name == "gpu" and gpu_count() < CP:
        print(f"gpu-check: needs >= {CP} GPUs visible to torch, found {gpu_count()} "
              "(run with --cpu to check the same path with the torch reference)")
        return 1
    from hcp_tune.engine.launch import run_local_batch
    from hcp_tune.errors import ConfigError

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
    if mode.name == "cpu":
        print(gpucheck_bridge.SKIPPED, flush=True)
    elif not args.no_bridge:  # one verdict line per Bridge run (hcp_tune/gpucheck/bridge.py)
        for ok_line in gpucheck_bridge.run(mode.cluster, workdir / "bridge"):
            print(ok_line[1], flush=True)
            verdicts.append(ok_line)
    passed = sum(ok for ok, _ in verdicts)
    print(f"gpu-check: {passed}/{len(verdicts)} layouts pass")
    return 0 if passed == len(verdicts) else 1


def _first_session(cluster: str, workdir: Optional[str], *, dry: bool) -> int:
    """The first GPU session's sequence (``gpucheck.session``); ``dry``: on CPU, built and
    printed. Exit 0 when every check that ran passed (dry: every step was built)."""
    from hcp_tune.gpucheck import session

    folder = Path(workdir or tempfile.mkdtemp(prefix="hcp-gpu-check-")).resolve()
    gpus = 0 if dry else gpu_count()
    print(f"gpu-check: first-session{' dry run (CPU)' if dry else ''}: {gpus} GPU(s), "
          f"profile {cluster}", flush=True)
    print(f"gpu-check: logs in {folder}", flush=True)
    lines = session.run(session.Ctx(cluster=cluster, workdir=folder, gpus=gpus), dry=dry,
                        out=lambda line: print(line, flush=True))
    passed = sum(ok for ok, _ in lines)
    print(f"gpu-check: {passed}/{len(lines)} first-session checks pass"
          + (" (dry: the other steps were built, not run)" if dry else ""))
    return 0 if passed == len(lines) else 1


def _one_gpu(cluster: str, workdir: Optional[str]) -> int:
    """The one-GPU mode (``gpucheck.single``): one line per check, then what it could not."""
    from hcp_tune.gpucheck import single

    if gpu_count() < 1:
        print("gpu-check: --one-gpu needs a GPU visible to torch, found 0 "
              "(run with --cpu to check the path with the torch reference)")
        print(single.NOT_CHECKED)
        return 1
    folder = Path(workdir or tempfile.mkdtemp(prefix="hcp-gpu-check-")).resolve()
    print(f"gpu-check: one-gpu mode ({gpu_count()} GPU(s) visible, profile {cluster}); logs in "
          f"{folder}", flush=True)
    verdicts = single.run(cluster, folder)
    for _, line in verdicts:
        print(line, flush=True)
    print(single.NOT_CHECKED)
    passed = sum(ok for ok, _ in verdicts)
    print(f"gpu-check: {passed}/{len(verdicts)} one-gpu checks pass")
    return 0 if passed == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
