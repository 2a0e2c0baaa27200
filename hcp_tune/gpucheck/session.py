"""The first GPU session's checks (``scripts/gpu_check.sh --first-session``), in order, one
script: what a reading of the Bridge runner cannot prove and one lent GPU (then 4-8) can.

Each step says what it runs and what it proves (``STEPS``; docs/bridge-runner.md lists the
same). ``--dry`` walks the whole sequence on CPU: the imports step runs, every other step
builds its trials exactly as it would (config, plan, TrialSpec, the Bridge field mapping)
and prints what it would run, so a broken step is found before GPU time is spent on it.
With fewer GPUs than a step needs it says so and moves on; a step whose stack is missing
(no Transformer Engine, Megatron-Core or Megatron-Bridge) reports "not run" with the reason.
Under 10 minutes on one GPU: Bridge runs of a 2-layer Llama-3-8B-shaped model.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hcp_tune.spec import Status, TrialResult, TrialSpec

MODEL, LAYERS = "llama3-8b", 2
MASK_SEQ, FIT_SEQ = 32768, 8192
Line = tuple[bool, str]


@dataclass
class Ctx:
    cluster: str
    workdir: Path
    gpus: int
    results: dict = dataclasses.field(default_factory=dict)  # step name -> its results


@dataclass(frozen=True)
class Step:
    name: str
    gpus: int  # the GPUs it needs
    runs: str
    proves: str
    build: Optional[Callable[[Ctx], list[TrialSpec]]] = None
    check: Optional[Callable[[Ctx, list[TrialSpec]], list[Line]]] = None


def _spec(ctx: Ctx, tid: str, *, cp: int = 1, pp: int = 1, seq: int = FIT_SEQ, m: int = 1,
          a2a: Optional[int] = None, overrides: tuple[str, ...] = ()) -> TrialSpec:
    """A Bridge trial built the way a sweep builds it, shrunk to ``LAYERS`` layers."""
    from hcp_tune import config
    from hcp_tune.engine.trials import spec_for
    from hcp_tune.space import plan

    cfg = config.load([f"cp={cp}", f"seq={seq}", "tp=1", f"pp={pp}", f"model={MODEL}",
                       f"cluster={ctx.cluster}", "runner=bridge", "dtype=bf16"])
    cands = [c for c in plan.candidates(cfg) if a2a is None or c.layout.a2a == a2a]
    spec = spec_for(cfg, cands[0], f"gpu-check-{tid}", ctx.workdir / "progress")
    return dataclasses.replace(spec, layers=LAYERS * pp, warmup_steps=2, measure_steps=5,
                               micro_batches=m, progress_path=None, time_limit_s=240.0,
                               bridge_overrides=list(overrides))


def _run(ctx: Ctx, specs: list[TrialSpec]) -> list[TrialResult]:
    from hcp_tune.engine.launch import run_local

    return [run_local(s, workdir=ctx.workdir / s.trial_id) for s in specs]


def _line(step: str, ok: bool, text: str) -> Line:
    return ok, f"gpu-check first-session {step}: {'PASS' if ok else 'FAIL'}  {text}"


def _stack_missing() -> Optional[str]:
    from hcp_tune.job.bridge.runner import missing_stack

    return missing_stack()


# ---------------------------------------------------------------- the steps' checks

def check_imports(ctx: Ctx, _specs) -> list[Line]:
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
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [_line("imports", True, f"torch {torch.__version__}, {cuda} CUDA device(s); "
                  + ", ".join(found))]


def check_one_gpu(ctx: Ctx, _specs) -> list[Line]:
    from hcp_tune.gpucheck import single

    return single.run(ctx.cluster, ctx.workdir / "one-gpu")


def _describe(res: TrialResult) -> str:
    rss = res.verification.get("host_peak_rss_bytes")
    return (f"{res.status.value}" + (f", median step {res.median_s:.4g} s" if res.median_s else "")
            + (f", host peak RSS {rss / 2**30:.1f} GiB" if rss else "")
            + (f" ({res.error})" if res.error else ""))


def check_mask(ctx: Ctx, specs: list[TrialSpec]) -> list[Line]:
    missing = _stack_missing()
    if missing:
        return [_line("bridge-32k-mask", False, f"not run: {missing}")]
    off, on = _run(ctx, specs)
    ctx.results["mask"] = (specs[0], off)
    ok = off.status is Status.OK
    return [_line("bridge-32k-mask", ok, f"seq={MASK_SEQ} cp=1, mask off (the runner's): "
                  f"{_describe(off)}; mask on (Megatron-Core's default): {_describe(on)}")]


def log_medians(folder: Path, warmup: int) -> list[float]:
    """Bridge's own "elapsed time per iteration" of every log under ``folder``, after the
    warm-up (``measure.parse_log``)."""
    from hcp_tune.job.bridge.measure import parse_log

    text = "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*"))
                     if p.is_file() and p.suffix in (".log", ".out", ".err"))
    return parse_log(text, warmup_steps=warmup, world_size=1).step_times_s


def check_recorder(ctx: Ctx, _specs) -> list[Line]:
    import statistics

    spec, res = ctx.results.get("mask", (None, None))
    if res is None or not res.median_s:
        return [_line("recorder-vs-log", False, "not run: no measured 32K run")]
    logged = log_medians(ctx.workdir / spec.trial_id, spec.warmup_steps)
    if not logged:
        return [_line("recorder-vs-log", False, "Bridge's iteration lines not found in the logs")]
    ref = statistics.median(logged)
    gap = res.median_s / ref - 1
    # the recorder times train_step alone, Bridge's timer the whole loop body with a barrier
    ok = -0.10 <= gap <= 0.02
    return [_line("recorder-vs-log", ok, f"recorder median {res.median_s:.4g} s, Bridge's "
                  f"elapsed time per iteration {ref:.4g} s ({gap:+.1%}; expected -10%..+2%)")]


def _fit_line(step: str, specs: list[TrialSpec], results: list[TrialResult]) -> Line:
    from hcp_tune.engine.trials import points_fit

    bad = [r for r in results if r.status is not Status.OK or not r.median_s]
    if bad:
        return _line(step, False, f"a run did not measure: {_describe(bad[0])}")
    fit = points_fit(specs, results)
    reason = fit.linearity()
    res = ", ".join(f"{r:+.3g}" for r in fit.residuals_s())
    return _line(step, reason is None and fit.per_micro_batch_s > 0,
                 f"m={[s.micro_batches for s in specs]}: step = {fit.fixed_s:.4g} s + "
                 f"{fit.per_micro_batch_s:.4g} s * m, residuals {res} s"
                 + (f" -- {reason}" if reason else " (a line within the noise)"))


def check_fit(ctx: Ctx, specs: list[TrialSpec]) -> list[Line]:
    missing = _stack_missing()
    if missing:
        return [_line(f"fit-pp{specs[0].pp}", False, f"not run: {missing}")]
    return [_fit_line(f"fit-pp{specs[0].pp}", specs, _run(ctx, specs))]


def check_guard(ctx: Ctx, _specs) -> list[Line]:
    from hcp_tune.gpucheck import bridge

    return bridge.run(ctx.cluster, ctx.workdir / "guard")


def check_negatives(ctx: Ctx, specs: list[TrialSpec]) -> list[Line]:
    """A misconfiguration must never end ok: Bridge's validation or the guard stops it."""
    missing = _stack_missing()
    if missing:
        return [_line("negatives", False, f"not run: {missing}")]
    out = []
    fits = [s for s in specs if s.world_size <= ctx.gpus]
    out += [(True, f"gpu-check first-session negative {' '.join(s.bridge_overrides)}: SKIPPED  "
                   f"needs {s.world_size} GPUs") for s in specs if s not in fits]
    for spec, res in zip(fits, _run(ctx, fits)):
        caught = res.status is not Status.OK
        out.append(_line(f"negative {' '.join(spec.bridge_overrides)}", caught,
                         f"[{spec.a2a},{spec.p2p}]: {res.status.value} "
                         f"({(res.error or '')[:160]})"))
    return out


def srun_command(cluster: str) -> list[str]:
    """A cp=4 Bridge sweep whose tasks each see one GPU (--gpus-per-task=1)."""
    return [sys.executable, "-m", "hcp_tune", "sweep", "runner=bridge", "cp=4", f"seq={FIT_SEQ}",
            "tp=1", "pp=1", f"model={MODEL}", f"cluster={cluster}", "gbs=4",
            "runner.measure_steps=3", "executor=slurm",
            "executor.extra_srun=['--gpus-per-task=1','--gpu-bind=single']"]


def check_srun(ctx: Ctx, _specs) -> list[Line]:
    import subprocess

    if not os.environ.get("SLURM_JOB_ID"):
        return [_line("srun-one-gpu-per-task", False, "not run: not inside a SLURM allocation "
                      f"(run: {shlex.join(srun_command(ctx.cluster))})")]
    proc = subprocess.run(srun_command(ctx.cluster), capture_output=True, text=True,
                          timeout=540)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return [_line("srun-one-gpu-per-task", proc.returncode == 0, tail[0][:200])]


STEPS = (
    Step("imports", 0, "import torch, transformer_engine, megatron.core, megatron.bridge",
         "which stack this node has (versions), CUDA visible", check=check_imports),
    Step("one-gpu", 1, "gpucheck.single: the binding, TE's backend choice, a Bridge run at cp=1",
         "LOCAL_RANK stays the task's and Bridge is told the GPU; TE selects a backend; the "
         "callbacks time steps and read memory", check=check_one_gpu),
    Step("bridge-32k-mask", 1, f"a cp=1 Bridge scratch run at seq={MASK_SEQ}, mask off (ours) "
         "and on (dataset.create_attention_mask=true)",
         "the host RSS the S x S mask costs and that the run without it is not slower",
         build=lambda ctx: [_spec(ctx, "mask-off", seq=MASK_SEQ),
                            _spec(ctx, "mask-on", seq=MASK_SEQ,
                                  overrides=("dataset.create_attention_mask=true",))],
         check=check_mask),
    Step("recorder-vs-log", 1, "the mask-off run's recorder median against Bridge's own "
         "'elapsed time per iteration' lines",
         "the callbacks time what Bridge times (train_step: at most 10% below its loop "
         "timer, never above)", check=check_recorder),
    Step("fit-pp1", 1, f"cp=1 pp=1 Bridge runs at m=1, 3, 9, seq={FIT_SEQ}",
         "step = a + b*m is a line at pp=1 (the residual within the noise)",
         build=lambda ctx: [_spec(ctx, f"fit1-m{m}", m=m) for m in (1, 3, 9)],
         check=check_fit),
    Step("guard-cp4", 4, "gpucheck.bridge: [2,2] a2a+p2p and its [1,4] baseline at cp=4",
         "CP proven active on every TE attention module at train start (issue #2667 caught)",
         check=check_guard),
    Step("negatives", 4, "[2,2] with hierarchical sizes null; with 8 GPUs [2,4] run with the "
         "sizes swapped ([4,2])", "a misconfigured HCP never ends ok: Bridge's validation "
         "or the guard stops it",
         build=lambda ctx: [_spec(ctx, "null-sizes", cp=4, a2a=2, overrides=(
             "model.hierarchical_context_parallel_sizes=null",)), _spec(
                 ctx, "swapped-sizes", cp=8, a2a=2, overrides=(
                     "model.hierarchical_context_parallel_sizes=[4,2]",))],
         check=check_negatives),
    Step("fit-pp2", 4, f"cp=2 pp=2 Bridge runs at m=2, 6, 18, seq={FIT_SEQ}",
         "the 1F1B fit is a line with a pipeline bubble",
         build=lambda ctx: [_spec(ctx, f"fit2-m{m}", cp=2, pp=2, m=m) for m in (2, 6, 18)],
         check=check_fit),
    Step("srun-one-gpu-per-task", 4, "a cp=4 sweep with executor.extra_srun="
         "[--gpus-per-task=1,--gpu-bind=single] (inside a SLURM allocation)",
         "one GPU per task: dist.external_gpu_device_mapping, only local rank 0 compiles",
         check=check_srun),
)


def describe_spec(spec: TrialSpec) -> str:
    """What a run would be: its world, sequence, m and the fields that matter here."""
    from hcp_tune.job.bridge.config import bridge_fields

    f = bridge_fields(spec)
    return (f"{spec.trial_id}: world {spec.world_size} (tp{spec.tp} cp{spec.cp} pp{spec.pp}) "
            f"[{spec.a2a},{spec.p2p}] seq {spec.seq} m {spec.micro_batches} layers {spec.layers}; "
            f"create_attention_mask={f.get('dataset.create_attention_mask')}, hierarchical sizes "
            f"{f.get('model.hierarchical_context_parallel_sizes')}")


def run(ctx: Ctx, *, dry: bool, out: Callable[[str], None] = print) -> list[Line]:
    """Every step in order (``dry``: build and print, run only the imports)."""
    lines: list[Line] = []
    width = max(60, min(100, int(os.environ.get("COLUMNS") or 100)))
    for i, step in enumerate(STEPS, 1):
        out(textwrap.fill(f"step {i} {step.name} (needs {step.gpus} GPU(s)): runs {step.runs};"
                          f" proves {step.proves}", width=width, subsequent_indent="    ",
                          break_on_hyphens=False))
        # On GPUs a step that cannot run is said before it is built: too few GPUs, or (for a
        # Bridge run) no Bridge stack, whose absence would otherwise surface as whatever
        # orchestrator import the build needs first (seen on a lent H200: "No module named
        # 'submitit'" where the cause was no TE and no Bridge).
        if not dry and step.gpus > ctx.gpus:
            out(f"gpu-check first-session {step.name}: SKIPPED  needs {step.gpus} GPU(s), "
                f"{ctx.gpus} visible")
            continue
        missing = _stack_missing() if not dry and step.build else None
        if missing:
            lines.append(_line(step.name, False, f"not run: {missing}"))
            out(textwrap.fill(lines[-1][1], width=width, subsequent_indent="    "))
            continue
        try:
            specs = step.build(ctx) if step.build else []
        except Exception as e:  # a step that cannot even be built is a failed step
            lines.append(_line(step.name, False, f"could not build: {type(e).__name__}: {e}"))
            out(textwrap.fill(lines[-1][1], width=width, subsequent_indent="    "))
            continue
        what = [describe_spec(s) for s in specs]
        if step.name == "srun-one-gpu-per-task":
            what.append(shlex.join(srun_command(ctx.cluster)))
        for text in what:
            out(textwrap.fill(("  would run " if dry else "  run ") + text, width=width,
                              subsequent_indent="      ", break_on_hyphens=False,
                              break_long_words=False))
        if dry and step.name != "imports":
            continue
        try:
            got = step.check(ctx, specs) if step.check else []
        except Exception as e:  # a crashed check is a failed check, with its line
            got = [_line(step.name, False, f"{type(e).__name__}: {str(e)[:200]}")]
        for line in got:
            out(textwrap.fill(line[1], width=width, subsequent_indent="    ",
                              break_on_hyphens=False, break_long_words=False))
        lines += got
    return lines
