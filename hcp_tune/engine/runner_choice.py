"""Which runner a command measures with: ``runner=auto`` decided here, in the engine that
runs the sweep, before anything is written.

- ``resolve_runner(name, command=)``: ``runner=auto`` -> ``model`` (no GPU, no SLURM on this
  machine: the cost model predicts) or ``attention`` for ``sweep``; always a measuring
  runner for ``trial``, which refuses ``model`` and ``synthetic``.
- ``sweep_runner(cfg)``: the same for a sweep, then SLURM asked whether it can run it
  (installed but not answering: ``auto`` predicts, an asked-for runner stops with one line,
  exit 5; answering without the nodes a trial needs: ``auto`` predicts).

Each returns the runner and a one-line reason ('' when it is the one asked for). Never
imports torch.
"""
from __future__ import annotations

import shutil
from typing import Any

from hcp_tune.errors import ConfigError


def resolve_runner(name: str, *, command: str = "sweep") -> tuple[str, str]:
    """The runner to use for ``runner=name`` and a one-line reason ('' when as asked).

    ``name`` was checked at load (settings.RunnerConfig). For ``sweep``, ``auto`` picks
    ``model`` when this machine has no GPU (no ``nvidia-smi`` on PATH) and no SLURM (no
    ``sbatch``), else ``attention``. ``trial`` always measures: ``auto`` is ``attention``
    there and ``model`` is an error.
    """
    if command == "trial":
        if name == "synthetic":
            raise ConfigError(
                "runner=synthetic: trial measures one layout on this machine, and a synthetic "
                "trial measures nothing; sweep it instead (python -m hcp_tune sweep ... "
                "runner=synthetic runner.truth=FILE), or use runner=attention to measure")
        if name == "model":
            raise ConfigError(
                "runner=model: trial measures one layout and runner=model only predicts; "
                "use runner=attention (or auto), or `python -m hcp_tune predict ...` to predict")
        return ("attention" if name == "auto" else name), ""
    if name == "model":
        return "model", ("runner=model: predicting with the cost model, nothing is measured; "
                         "use runner=attention to measure")
    if name != "auto":
        return name, ""
    gpu, slurm = shutil.which("nvidia-smi"), shutil.which("sbatch")
    if gpu or slurm:
        found = " and ".join(x for x, y in (("a GPU", gpu), ("SLURM", slurm)) if y)
        return "attention", f"runner=auto: {found} here: measuring with runner=attention"
    return "model", ("runner=auto: no GPU and no SLURM here: predicting with the cost model; "
                     "run on a cluster with executor=slurm runner=attention to measure")


def sweep_runner(cfg: Any) -> tuple[str, str]:
    """``resolve_runner`` for a sweep of ``cfg``, then SLURM asked, before anything is
    written, whether it can run the sweep (not for ``model``, which measures nothing, nor
    ``synthetic``, whose trials run in this process)."""
    runner, reason = resolve_runner(cfg.runner.name)
    if runner in ("model", "synthetic"):
        return runner, reason
    from hcp_tune.engine import dispatch, slurm_probe

    if dispatch.resolve_executor_name(cfg.executor.name) != "slurm":
        return runner, reason
    answer = slurm_probe.ask()
    auto = cfg.runner.name == "auto"
    if answer.error and (not auto or cfg.executor.name == "slurm"):
        raise slurm_probe.refuse(answer, cfg.executor.name)
    if answer.error:
        return "model", (f"runner=auto: SLURM is installed but does not answer "
                         f"({answer.error}): predicting with the cost model, nothing measured")
    small = slurm_probe.cannot_host(cfg, answer) if auto else ""
    if small:  # a login node of another cluster, or a one-node test cluster
        return "model", (f"runner=auto: {small}: predicting with the cost model; measure on a "
                         "cluster that fits (or give runner=attention to submit anyway)")
    return runner, reason
