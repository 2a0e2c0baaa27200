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
``--first-session`` runs the first GPU session on one 8-GPU node inside the allocation the
user holds (``gpucheck.session``: its steps; ``gpucheck.schedule``: one-GPU steps anywhere,
four-GPU steps on GPUs 0-3 and 4-7 side by side, each step its own process, one deadline,
``--deadline-s``, default 600 s, that stops what it started), into its own folder
(``./gpu-check-<time>``, or ``--workdir``), with a PASS/FAIL line per step and a summary to
paste into a bug report. ``--dry`` prints that plan on CPU for one 8-GPU node: every step
built, with its GPUs, its estimate and the estimated total. This process starts no CUDA
context: the GPUs are counted with nvidia-smi, and every check's context lives in a child.
Exit 0 when every layout passes, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from hcp_tune.gpucheck import bridge as gpucheck_bridge
from hcp_tune.gpucheck.attention import CP, CPU, GPU, LAYOUTS, build_specs, verdict


def _smi(*query: str) -> list[str]:
    """``nvidia-smi`` lines (no CUDA context in this process); [] without it."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []


def gpu_count() -> int:
    """The GPUs this process may use, counted without starting CUDA here: the checks'
    CUDA contexts live in their own processes (``CUDA_VISIBLE_DEVICES`` narrows it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = len(_smi("--list-gpus"))
    if visible is not None:
        return min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def gpu_names() -> str:
    """``8 x NVIDIA H100 80GB HBM3, driver 550.54``, from nvidia-smi."""
    rows = _smi("--query-gpu=name,driver_version", "--format=csv,noheader")
    if not rows:
        return ""
    names = [r.split(",")[0].strip() for r in rows]
    return (f"{len(names)} x {names[0]}" + (" (mixed)" if len(set(names)) > 1 else "")
            + f", driver {rows[0].split(',')[-1].strip()}")


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
                    help="the first-session plan on CPU for one 8-GPU node: every step built, "
                    "with its GPUs, its estimate and the total")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="--first-session: stop every step still running after this many "
                    "seconds (default 600)")
    args = ap.parse_args(argv)
    if args.deadline_s is not None and args.deadline_s <= 0:
        ap.error(f"--deadline-s={args.deadline_s:g}: expected seconds > 0, e.g. 600")
    if args.dry or args.first_session:
        from hcp_tune.gpucheck.session import DEADLINE_S

        return _first_session(args.cluster or GPU.cluster, args.workdir, dry=args.dry,
                              deadline_s=args.deadline_s or DEADLINE_S)
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


def _first_session(cluster: str, workdir: Optional[str], *, dry: bool,
                   deadline_s: float) -> int:
    """The first GPU session (``gpucheck.session`` steps placed by ``gpucheck.schedule``);
    ``dry``: every step built on CPU and the plan printed for one 8-GPU node."""
    import textwrap

    from hcp_tune.gpucheck import schedule, session

    if dry:
        folder = Path(workdir or tempfile.mkdtemp(prefix="hcp-gpu-check-")).resolve()
    else:  # its own folder, beside where it was started: the logs to attach to a report
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = Path(workdir or f"gpu-check-{stamp}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    gpus = session.NODE_GPUS if dry else gpu_count()
    plan = schedule.simulate(session.STEPS, gpus)
    total = max((s.end_s for s in plan), default=0.0)
    width = max(60, min(100, int(os.environ.get("COLUMNS") or 100)))

    def say(text: str, indent: str = "    ") -> None:
        print(textwrap.fill(text, width=width, subsequent_indent=indent,
                            break_on_hyphens=False, break_long_words=False), flush=True)

    print(f"gpu-check: first-session{' dry run (CPU, nothing runs)' if dry else ''}: "
          f"{gpus} GPU(s){' planned' if dry else ''}, profile {cluster}, deadline "
          f"{deadline_s:.0f} s", flush=True)
    print(f"gpu-check: results in {folder}", flush=True)
    slots = {s.name: s for s in plan}
    built = 0
    for i, step in enumerate(session.STEPS, 1):
        slot = slots.get(step.name)
        where = (f"GPUs {schedule.gpus_text(slot.gpus)}, estimate {step.estimate_s:.0f} s, at "
                 f"{slot.start_s:.0f}-{slot.end_s:.0f} s" if slot else
                 f"needs {step.gpus} GPUs: skipped here")
        say(f"step {i} {step.name} ({where}): runs {step.runs}; proves {step.proves}")
        if not dry:
            continue
        ctx = session.Ctx(cluster=cluster, workdir=folder / step.name, gpus=step.gpus)
        try:
            specs = step.build(ctx) if step.build else []
            built += 1
        except Exception as e:  # a step that cannot even be built is what --dry is for
            say(f"  could not build: {type(e).__name__}: {e}", "      ")
            continue
        for spec in specs:
            say("  would run " + session.describe_spec(spec), "      ")
    estimate = (f"estimate {total:.0f} s ({total / 60:.1f} min) for {len(plan)} step(s) on "
                f"{gpus} GPU(s), each step's estimate placed as they run (1-GPU steps on any "
                "GPU, 4-GPU steps on GPUs 0-3 and 4-7 side by side, 8-GPU steps alone)")
    say(f"gpu-check: {estimate}; deadline {deadline_s:.0f} s")
    if dry:
        print(f"gpu-check: dry: {built}/{len(session.STEPS)} steps built")
        return 0 if built == len(session.STEPS) else 1
    t0 = time.monotonic()
    outcomes = schedule.run(session.STEPS, gpus, folder, cluster, deadline_s,
                            out=lambda line: say(line))
    for line in summary(outcomes, folder, gpus, time.monotonic() - t0, deadline_s, total):
        print(line, flush=True)
    return 0 if all(o.state in ("PASS", "SKIPPED") for o in outcomes) else 1


def summary(outcomes: list, folder: Path, gpus: int, wall_s: float, deadline_s: float,
            estimate_s: float) -> list[str]:
    """A block to paste into a bug report: where it ran, on what, each step's verdict."""
    import platform
    import socket

    counts = {s: sum(o.state == s for o in outcomes) for s in ("PASS", "FAIL", "SKIPPED",
                                                               "NOT RUN")}
    imports = next((o.text for o in outcomes if o.name == "imports"), "not run")
    head = "----- gpu-check first-session summary (paste into a bug report) -----"
    return [head,
            f"host {socket.gethostname()}, Python {platform.python_version()}, "
            f"{gpus} GPU(s): {gpu_names() or 'nvidia-smi not found'}",
            f"stack: {imports}",
            "steps: " + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f"; wall {wall_s:.0f} s of the {deadline_s:.0f} s deadline (estimate "
            f"{estimate_s:.0f} s)",
            *[f"{o.state:7s} {o.name} [GPUs {', '.join(map(str, o.gpus)) or '-'}, "
              f"{o.wall_s:.0f} s]: {o.text}" for o in outcomes],
            f"logs: {folder}/<step>/step.log",
            "-" * len(head)]


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
