"""Running the first session's steps on one node's GPUs, several at a time, under one deadline.

What belongs here: which GPUs a step gets (``assign``: one GPU anywhere, four GPUs as the
half 0-3 or 4-7, eight GPUs as the whole node), the estimate of the whole session by the
same placement rule (``simulate``: each step's own estimate, steps started in order as soon
as their GPUs are free, a later step may start before an earlier one that waits for more
GPUs), and ``run``: every step as its own child process (``python -m hcp_tune.gpucheck.session
--step NAME``) with ``CUDA_VISIBLE_DEVICES`` set to its GPUs and its output in
``<workdir>/<step>/step.log``, polled until it ends; at the deadline every step still
running is stopped (its process group: the step and the trial processes it started) and
the steps not started are reported as not run. This process never touches CUDA: every CUDA
context of the session lives in a step's process.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

HALF = 4  # the 4-GPU steps run on GPUs 0-3 and 4-7, two at a time on an 8-GPU node
POLL_S = 0.5  # how often the running steps are looked at
STOP_GRACE_S = 10.0  # after SIGTERM at the deadline: then SIGKILL


def assign(free: set[int], need: int, total: int) -> Optional[list[int]]:
    """The GPUs a step needing ``need`` gets now from ``free`` (of ``total``), or None.
    Four-GPU steps take a whole aligned half, so two run side by side; one-GPU steps take
    the lowest free GPU, which fills the first half before the second."""
    if need == 0:
        return []
    if need > total:
        return None
    if need == total:
        return sorted(free) if len(free) == total else None
    if need == HALF:
        for start in range(0, total - HALF + 1, HALF):
            half = set(range(start, start + HALF))
            if half <= free:
                return sorted(half)
        return None
    return sorted(free)[:need] if len(free) >= need else None


@dataclass
class Slot:
    """One step placed in the session: its GPUs and its start and end (estimated, or real)."""

    name: str
    gpus: list[int]
    start_s: float
    end_s: float


def simulate(steps: Sequence, total: int) -> list[Slot]:
    """The session's schedule from each step's ``estimate_s`` (steps needing more GPUs
    than ``total`` are left out): what ``run`` does, with the estimates as durations."""
    pending = [s for s in steps if s.gpus <= total]
    free, t, running, out = set(range(total)), 0.0, [], []
    while pending or running:
        for step in list(pending):
            got = assign(free, step.gpus, total)
            if got is None:
                continue
            free -= set(got)
            slot = Slot(step.name, got, t, t + step.estimate_s)
            running.append(slot)
            out.append(slot)
            pending.remove(step)
        if not running:
            break
        t = min(s.end_s for s in running)
        for slot in [s for s in running if s.end_s <= t]:
            running.remove(slot)
            free |= set(slot.gpus)
    return out


def gpus_text(gpus: list[int]) -> str:
    if not gpus:
        return "none"
    if gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 1:
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


@dataclass
class Outcome:
    """What one step came to: ``state`` is PASS, FAIL, SKIPPED or NOT RUN."""

    name: str
    state: str
    text: str
    gpus: list[int] = field(default_factory=list)
    wall_s: float = 0.0


def step_command(name: str, workdir: Path, cluster: str) -> list[str]:
    return [sys.executable, "-m", "hcp_tune.gpucheck.session", "--step", name,
            "--workdir", str(workdir), "--cluster", cluster]


def _read(folder: Path, proc_rc: Optional[int]) -> tuple[str, str]:
    try:
        got = json.loads((folder / "step.json").read_text())
        return ("PASS" if got["ok"] else "FAIL"), got["line"]
    except (OSError, ValueError, KeyError):
        tail = ""
        log = folder / "step.log"
        if log.exists():
            lines = log.read_text(errors="replace").strip().splitlines()
            tail = lines[-1][:200] if lines else ""
        return "FAIL", f"the step's process ended (exit {proc_rc}) without a result: {tail}"


def _stop(proc: subprocess.Popen) -> None:
    """Stop a step and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(steps: Sequence, total: int, workdir: Path, cluster: str, deadline_s: float, *,
        out: Callable[[str], None] = print,
        command: Callable[[str, Path, str], list[str]] = step_command) -> list[Outcome]:
    """Every step in its own process group on its GPUs; one PASS/FAIL line as each ends."""
    t0 = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    for s in steps:
        if s.gpus > total:
            outcomes[s.name] = Outcome(s.name, "SKIPPED", f"needs {s.gpus} GPUs, {total} here")
            out(f"gpu-check {s.name}: SKIPPED  needs {s.gpus} GPU(s), {total} visible")
    pending = [s for s in steps if s.name not in outcomes]
    free = set(range(total))
    running: dict[str, tuple[subprocess.Popen, list[int], float]] = {}
    while pending or running:
        now = time.monotonic() - t0
        if now >= deadline_s:
            break
        for step in list(pending):
            got = assign(free, step.gpus, total)
            if got is None:
                continue
            free -= set(got)
            folder = workdir / step.name
            folder.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, got)),
                   "HCP_TUNE_GPU_CHECK_DEADLINE": str(t0 + deadline_s - time.monotonic())}
            with open(folder / "step.log", "w") as log:
                proc = subprocess.Popen(command(step.name, workdir, cluster), env=env,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            running[step.name] = (proc, got, now)
            pending.remove(step)
            out(f"gpu-check {step.name}: started on GPUs {gpus_text(got)} at {now:.0f} s")
        for name, (proc, got, started) in list(running.items()):
            if proc.poll() is None:
                continue
            state, text = _read(workdir / name, proc.returncode)
            wall = time.monotonic() - t0 - started
            outcomes[name] = Outcome(name, state, text, got, wall)
            out(f"gpu-check {name}: {state}  {text} ({wall:.0f} s)")
            free |= set(got)
            del running[name]
        time.sleep(POLL_S)
    for name, (proc, got, started) in running.items():  # the deadline: stop what it started
        _stop(proc)
        wall = time.monotonic() - t0 - started
        outcomes[name] = Outcome(name, "FAIL", f"stopped at the {deadline_s:.0f} s deadline "
                                 f"after {wall:.0f} s", got, wall)
        out(f"gpu-check {name}: FAIL  {outcomes[name].text}")
    for step in pending:
        outcomes[step.name] = Outcome(step.name, "NOT RUN", f"the {deadline_s:.0f} s deadline "
                                      "passed before it could start")
        out(f"gpu-check {step.name}: NOT RUN  {outcomes[step.name].text}")
    return [outcomes[s.name] for s in steps]
