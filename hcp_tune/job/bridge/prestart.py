"""The process environment a Bridge trial exports before CUDA starts, and what it checks
after Bridge built its config. Standard library only (job side).

Why before: the CUDA caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` when it first
allocates, the driver reads ``CUDA_DEVICE_MAX_CONNECTIONS`` when the context is created,
NCCL reads its variables when the first communicator is made. The runner binds the GPU
(``torch.cuda.set_device``) before it builds Bridge's config, and Bridge applies the
config's ``env_vars`` only inside ``pretrain`` (Megatron-Bridge v0.6.0
``training/config.py`` ``apply_environment_variables``, with ``os.environ.setdefault``):
too late for all three. So:

- scratch mode exports the config's own ``env_vars`` (the Llama recipes', ``parity``);
- recipe mode exports what every Bridge hardware recipe puts in ``cfg.env_vars``
  (``COMMON_RECIPE_ENV_VARS``, recipes/utils/environment_utils.py; the 128K Llama 3 8B
  recipe sets exactly those) and, once the recipe is built, ``recipe_env_notes`` compares
  the recipe's ``cfg.env_vars`` with what was exported: a difference is a note in the trial;
- both export ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tp > 1 or cp > 1 on a GPU before
  Blackwell (compute capability major < 10). Megatron-LM core_v0.19.0
  ``megatron/training/arguments.py`` asserts exactly that for its own launcher, and
  Bridge's perf launcher sets it (``scripts/performance/utils/overrides.py``: 1 for tp or
  cp > 1, 32 on Blackwell); Bridge's ``pretrain`` checks nothing, so without it the TP and
  CP communication kernels may queue behind compute and the p2p ring loses its overlap.
  A value already in the environment (the user's) is left alone.

Whatever ends up set is in the trial's fingerprint (``knobs.settings``), so rows measured
with and without it are never pooled silently.
"""
from __future__ import annotations

import os
import subprocess
from typing import Any, Optional

from hcp_tune.job.bridge.parity import RECIPE_ENV_VARS

MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
BLACKWELL_MAJOR = 10  # compute capability 10.x: B200/GB200 (Megatron-LM: get_device_arch_version)

Capability = Optional[tuple[int, int]]


def gpu_capability() -> Capability:
    """The first GPU's compute capability from ``nvidia-smi``, without starting CUDA in this
    process (``torch.cuda.get_device_capability`` would); None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
        major, _, minor = out.splitlines()[0].strip().partition(".")
        return int(major), int(minor or 0)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def connections_needed(tp: int, cp: int, capability: Capability) -> bool:
    """Megatron-LM's rule: TP or CP on a GPU before Blackwell wants one hardware queue.
    An unknown GPU (no ``nvidia-smi``) is treated as pre-Blackwell: 1 is what Megatron-LM
    demands there and stays legal on Blackwell."""
    if tp <= 1 and cp <= 1:
        return False
    return capability is None or capability[0] < BLACKWELL_MAJOR


def prestart_env(spec: Any, fields: dict[str, Any], capability: Capability) -> dict[str, str]:
    """What to export before CUDA starts, in order: the config's ``env_vars`` (scratch) or
    the recipes' common environment (recipe mode), then the connections variable."""
    base = RECIPE_ENV_VARS if "recipe" in fields else (fields.get("env_vars") or {})
    env = {name: str(value) for name, value in base.items()}
    if connections_needed(spec.tp, spec.cp, capability):
        env[MAX_CONNECTIONS] = "1"
    return env


def export(env: dict[str, str], environ: Any = None) -> dict[str, str]:
    """Set each name that is not set yet (a value the launcher or user set wins, as Bridge's
    ``setdefault`` does); returns the names this call set, with their values."""
    environ = os.environ if environ is None else environ
    done = {}
    for name, value in env.items():
        if name not in environ:
            environ[name] = value
            done[name] = value
    return done


def recipe_env_notes(recipe_env: Optional[dict], exported: dict[str, str],
                     environ: Any = None) -> list[str]:
    """Recipe mode, after the build: where the recipe's ``cfg.env_vars`` differ from what
    was exported before CUDA. Bridge applies them with ``setdefault``, so a name the recipe
    has and the trial did not export reaches only what reads it after ``pretrain`` began;
    one the trial exported with another value keeps the exported value."""
    environ = os.environ if environ is None else environ
    recipe = {k: str(v) for k, v in (recipe_env or {}).items()}
    notes = []
    late = sorted(k for k in recipe if k not in exported and k not in environ)
    if late:
        notes.append("recipe env_vars applied only inside pretrain, after CUDA started: "
                     + ", ".join(f"{k}={recipe[k]}" for k in late))
    differ = sorted(k for k in recipe if k in exported and exported[k] != recipe[k])
    if differ:
        notes.append("recipe env_vars differ from what was exported before CUDA (the exported "
                     "value stays): " + ", ".join(f"{k}: recipe {recipe[k]}, exported "
                                                   f"{exported[k]}" for k in differ))
    missing = sorted(k for k in exported if k in RECIPE_ENV_VARS and k not in recipe)
    if missing:
        notes.append("exported before CUDA as Bridge's recipes do, but this recipe's env_vars "
                     "lack: " + ", ".join(missing))
    return notes
