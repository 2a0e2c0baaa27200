"""The hydra-submitit-launcher baseline: what a user's own sweep glue looks like.

Each point of ``--multirun seq=...,... a2a=...`` is one SLURM job (``hydra/launcher=
submitit_slurm``) that runs ``python -m hcp_tune trial`` for that layout and saves the
TrialResult JSON it prints as ``trial.json`` in the point's output folder. No batching,
no early stop, no ledger: one process set, one import, one world group per point.

Runs in its own virtual environment (hydra-core + hydra-submitit-launcher only); the trial
itself runs under ``python=`` (the interpreter that has hcp_tune, torch, Megatron-Core)::

    python3 -m venv benchmarks/.venv-hydra
    benchmarks/.venv-hydra/bin/pip install hydra-core hydra-submitit-launcher
    benchmarks/.venv-hydra/bin/python benchmarks/hydra_baseline/app.py --multirun \
        cp=2 seq=256,512 a2a=1,2 hydra.sweep.dir=/tmp/hydra-sweep
"""
import subprocess
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg) -> None:
    out = Path(HydraConfig.get().runtime.output_dir)
    cmd = [cfg.python, "-m", "hcp_tune", "trial", f"cp={cfg.cp}", f"seq={cfg.seq}",
           f"a2a={cfg.a2a}", "model=tiny", "cluster=local", "runner=attention",
           f"runner.warmup_steps={cfg.warmup_steps}",
           f"runner.measure_steps={cfg.measure_steps}", f"results_dir={out / 'results'}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    (out / "trial.err").write_text(r.stderr)
    (out / "trial.json").write_text(r.stdout)  # the TrialResult, whatever its status
    if not r.stdout.strip():
        raise RuntimeError(f"hcp_tune trial exited {r.returncode} without a result; see "
                           f"{out / 'trial.err'}")


if __name__ == "__main__":
    main()
