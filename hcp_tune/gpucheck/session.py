"""The first GPU session's steps (``scripts/gpu_check.sh --first-session``): one 8-GPU node,
ten minutes, inside the allocation the user already holds (no sbatch, no queue).

Each step says what it runs, what it proves, the GPUs it needs and its estimate (``STEPS``);
``schedule`` places them (one-GPU steps anywhere, four-GPU steps on GPUs 0-3 and 4-7 side
by side, eight-GPU steps alone), runs each as its own process (``--step NAME``, below) and
stops what is still running at the deadline. The steps that matter for the default job
(Llama 3 8B at 128K: tp4 pp2 cp8 [2,4]) are the 8-GPU a2a+p2p runs with tp > 1 and with
pp > 1, the recipe run at 64K and the fit at the sweep's own micro-batch points.

Estimates are not measurements: a Bridge launch is taken as ``BRIDGE_LAUNCH_S`` (start-up of
a 2-layer model plus a few steps; the previous plan's 13 sequential launches were read as
about a minute each), a run Bridge's validation refuses as ``REFUSED_S``, the 8-GPU 64K
recipe run as ``RECIPE_S``; each step adds ``PY_START_S`` for its own Python. The first
session measures them (each step's wall time is in its line and the summary).

``--dry`` builds every step's trials on CPU (config, plan, TrialSpec, the Bridge field
mapping) and prints them with the schedule, so a broken step is found before GPU time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hcp_tune.gpucheck import checks
from hcp_tune.spec import TrialSpec

MODEL, LAYERS = "llama3-8b", 2  # Llama 3 8B's layer, 2 layers a pipeline stage
MASK_SEQ, FIT_SEQ, RECIPE_SEQ = 32768, 8192, 65536
RECIPE = "llama3_8b_128k_pretrain_config"  # Megatron-Bridge 0.6.x, recipes/llama/llama3.py
PY_START_S = 15  # a step's own Python: torch, hcp-tune, the config
BRIDGE_LAUNCH_S = 60  # one Bridge run of a 2-layer model: start-up, warm-up, 5 steps
REFUSED_S = 40  # a run Bridge refuses at its config validation, before the model is built
RECIPE_S = 90  # the 8-GPU recipe run at 64K: the recipe, its offline HF config, 4 layers
IMPORTS_S = 20  # importing TE, Megatron-Core and Megatron-Bridge
BINDING_TE_S = 20  # the one-GPU checks' own processes (binding, TE's backend choice)
DEADLINE_S = 600.0
GBS = 512  # the Llama 3 recipes' global batch: the m a sweep ranks at, so its measured points
NODE_GPUS = 8  # what --dry plans for: one 8-GPU node


@dataclass
class Ctx:
    cluster: str
    workdir: Path
    gpus: int
    deadline: Optional[float] = None  # monotonic time a step must end by (its process)
    results: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    name: str
    gpus: int  # the GPUs it needs
    estimate_s: float
    runs: str
    proves: str
    build: Optional[Callable[[Ctx], list[TrialSpec]]] = None
    check: Optional[Callable[[Ctx, list[TrialSpec]], checks.Line]] = None


def spec(ctx: Ctx, tid: str, *, cp: int = 1, tp: int = 1, pp: int = 1, seq: int = FIT_SEQ,
         m: Optional[int] = None, a2a: Optional[int] = None, recipe: Optional[str] = None,
         overrides: tuple[str, ...] = ()) -> TrialSpec:
    """A Bridge trial built the way a sweep builds it, shrunk to ``LAYERS`` layers a stage;
    ``m`` micro-batches (default: pp, the sweep's first point)."""
    from hcp_tune import config
    from hcp_tune.engine.trialspec import spec_for
    from hcp_tune.space import plan

    args = [f"cp={cp}", f"seq={seq}", f"tp={tp}", f"pp={pp}", f"model={MODEL}",
            f"cluster={ctx.cluster}", "runner=bridge", "dtype=bf16"]
    cfg = config.load(args + ([f"runner.recipe={recipe}"] if recipe else []))
    cands = [c for c in plan.candidates(cfg) if c.kept and (a2a is None or c.layout.a2a == a2a)]
    out = spec_for(cfg, cands[0], f"gpu-check-{tid}", ctx.workdir / "progress")
    layers = ("model.num_layers=" + str(LAYERS * pp),) if recipe else ()
    return dataclasses.replace(out, layers=LAYERS * pp, warmup_steps=2, measure_steps=5,
                               micro_batches=m or pp, progress_path=None, time_limit_s=240.0,
                               bridge_overrides=[*layers, *overrides])


def fit_points(ctx: Ctx, pp: int) -> tuple[int, ...]:
    """The micro-batch counts a sweep measures a layout at (``costmodel.microbatch``)."""
    from hcp_tune import config
    from hcp_tune.costmodel.microbatch import measure_points

    cfg = config.load([f"pp={pp}", "tp=1", "cp=2", f"seq={FIT_SEQ}", f"model={MODEL}",
                       f"cluster={ctx.cluster}", "runner=bridge", f"gbs={GBS}"])
    return measure_points(pp, cfg.micro_batches)


def _guard_pair(ctx: Ctx) -> list[TrialSpec]:
    return [spec(ctx, "guard-2x2", cp=4, a2a=2), spec(ctx, "guard-1x4", cp=4, a2a=1)]


STEPS = (
    Step("imports", 0, PY_START_S + IMPORTS_S,
         "import torch, transformer_engine, megatron.core, megatron.bridge (no GPU)",
         "which stack this node has (versions)", check=checks.imports),
    Step("one-gpu", 1, PY_START_S + BINDING_TE_S,
         "gpucheck.single's binding and TE checks, each in a child process",
         "LOCAL_RANK stays the task's and Bridge is told the GPU; TE selects a backend",
         check=checks.one_gpu),
    Step("bridge-32k", 1, PY_START_S + BRIDGE_LAUNCH_S + 15,
         f"a cp=1 Bridge scratch run at seq={MASK_SEQ} (no S x S mask, as the runner sets "
         "it); the recorder against Bridge's own log",
         "the callbacks time what Bridge times (at most 10% below its loop timer, never "
         "above), memory sampled every step with the allocator's retries",
         build=lambda ctx: [spec(ctx, "mask-off", seq=MASK_SEQ)], check=checks.mask_off),
    Step("mask-on-32k", 1, PY_START_S + BRIDGE_LAUNCH_S + 30,
         f"the same run with Megatron-Core's default mask (dataset.create_attention_mask=true)",
         "the host RSS and step time the S x S mask costs (compare with bridge-32k's line)",
         build=lambda ctx: [spec(ctx, "mask-on", seq=MASK_SEQ, overrides=(
             "dataset.create_attention_mask=true",))], check=checks.mask_on),
    Step("guard-cp4", 4, PY_START_S + 2 * BRIDGE_LAUNCH_S,
         "[2,2] a2a+p2p and its [1,4] ring baseline at cp=4",
         "CP proven active on every TE attention module at train start (issue #2667 caught)",
         build=_guard_pair, check=checks.guard),
    Step("fit-pp2", 4, PY_START_S + 3 * BRIDGE_LAUNCH_S,
         f"cp=2 pp=2 Bridge runs at the sweep's own points (m = pp, 2pp, 3pp), seq={FIT_SEQ}",
         "step = a + b*m is a line with a pipeline bubble, at the m a sweep measures",
         build=lambda ctx: [spec(ctx, f"fit2-m{m}", cp=2, pp=2, m=m)
                            for m in fit_points(ctx, 2)], check=checks.fit),
    Step("negatives", 4, PY_START_S + 2 * REFUSED_S,
         "[2,2] with hierarchical sizes null, and with cp_comm_type=p2p",
         "a misconfigured HCP never ends ok: Bridge's validation or the guard stops it",
         build=lambda ctx: [spec(ctx, "null-sizes", cp=4, a2a=2, overrides=(
             "model.hierarchical_context_parallel_sizes=null",)), spec(
                 ctx, "comm-p2p", cp=4, a2a=2, overrides=("model.cp_comm_type=p2p",))],
         check=checks.negatives),
    Step("gpu-per-task", 4, PY_START_S + BRIDGE_LAUNCH_S,
         "[2,2] at cp=4 as four tasks that each see one GPU (CUDA_VISIBLE_DEVICES per task, "
         "as srun --gpus-per-task=1 sets it), through the job entry",
         "dist.external_gpu_device_mapping: Bridge binds cuda:0 of each task, LOCAL_RANK stays "
         "the task's", build=lambda ctx: [spec(ctx, "per-task", cp=4, a2a=2)],
         check=checks.gpu_per_task),
    Step("tp2-cp4", 8, PY_START_S + BRIDGE_LAUNCH_S,
         "tp=2 cp=4 [2,2] a2a+p2p (8 GPUs), one measured run at m=1",
         "the default job's a2a+p2p with TP: groups interleaved with TP proven on every "
         "module, CUDA_DEVICE_MAX_CONNECTIONS=1 exported, placement and NCCL transport recorded",
         build=lambda ctx: [spec(ctx, "tp2-cp4", cp=4, tp=2, a2a=2)], check=checks.one_run),
    Step("pp2-cp4", 8, PY_START_S + BRIDGE_LAUNCH_S,
         "pp=2 cp=4 [2,2] a2a+p2p (8 GPUs), one measured run at m=2",
         "a2a+p2p on both pipeline stages, each stage's CP groups proven",
         build=lambda ctx: [spec(ctx, "pp2-cp4", cp=4, pp=2, a2a=2)], check=checks.one_run),
    Step("recipe-64k", 8, PY_START_S + RECIPE_S,
         f"recipe mode: {RECIPE} (Bridge 0.6.x) shrunk to {LAYERS} layers a stage, pp=2 cp=4 "
         f"[2,2] at seq={RECIPE_SEQ}", "the recipe's environment exported before CUDA and "
         "matching its env_vars, its GC and fusions, a long sequence through TE's a2a+p2p",
         build=lambda ctx: [spec(ctx, "recipe-64k", cp=4, pp=2, a2a=2, seq=RECIPE_SEQ,
                                 recipe=RECIPE)], check=checks.one_run),
)
BY_NAME = {s.name: s for s in STEPS}


def describe_spec(s: TrialSpec) -> str:
    """What a run would be: its world, sequence, m and the fields that matter here."""
    from hcp_tune.job.bridge.config import bridge_fields

    f = bridge_fields(s)
    mode = f"recipe {f['recipe']}" if "recipe" in f else "scratch"
    return (f"{s.trial_id}: world {s.world_size} (tp{s.tp} cp{s.cp} pp{s.pp}) [{s.a2a},{s.p2p}] "
            f"{s.comm_type} seq {s.seq} m {s.micro_batches}, {mode}; hierarchical sizes "
            f"{f.get('model.hierarchical_context_parallel_sizes')}"
            + (f"; overrides {' '.join(s.bridge_overrides)}" if s.bridge_overrides else ""))


# ---------------------------------------------------------------- one step, in its process

def run_step(name: str, workdir: Path, cluster: str) -> checks.Line:
    """Build and check one step here (``CUDA_VISIBLE_DEVICES`` is the step's GPUs); the
    result goes to ``<workdir>/<name>/step.json`` for the scheduler."""
    step = BY_NAME[name]
    left = float(os.environ.get("HCP_TUNE_GPU_CHECK_DEADLINE") or DEADLINE_S)
    ctx = Ctx(cluster=cluster, workdir=workdir / name, gpus=step.gpus,
              deadline=time.monotonic() + left)
    t0 = time.monotonic()
    missing = checks.stack_missing() if step.build else None
    if missing:
        line = (False, f"not run: {missing}")
    else:
        try:
            specs = step.build(ctx) if step.build else []
            for s in specs:
                print("run " + describe_spec(s), flush=True)
            line = step.check(ctx, specs)
        except Exception as e:  # a crashed step is a failed step, with its line
            line = (False, f"{type(e).__name__}: {str(e)[:300]}")
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    (ctx.workdir / "step.json").write_text(json.dumps(
        {"ok": line[0], "line": line[1], "wall_s": time.monotonic() - t0}))
    print(f"{'PASS' if line[0] else 'FAIL'}  {line[1]}", flush=True)
    return line


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hcp_tune.gpucheck.session")
    ap.add_argument("--step", required=True, choices=sorted(BY_NAME))
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--cluster", required=True)
    args = ap.parse_args(argv)
    ok, _ = run_step(args.step, Path(args.workdir), args.cluster)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
