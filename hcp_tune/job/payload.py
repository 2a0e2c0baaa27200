"""What a SLURM job unpickles and runs: the function the orchestrator hands submitit.

submitit pickles the payload function by reference, so the job process imports the
module that defines it before anything runs. Defined here, that is the job side only
(standard library, torch, Megatron-Core, TE, submitit); defined in the orchestrator's
modules it would drag hydra, optuna and pandas into the training container, where they
are usually absent. The local executor's payload lives beside the local launcher
(``hcp_tune.launch.local_payload``), which is standard-library only as well.
"""
from __future__ import annotations

from hcp_tune.spec import TrialResult, TrialSpec


def slurm_payload(spec: TrialSpec) -> TrialResult:
    """SLURM executor: every task of the job is one rank of the trial."""
    from hcp_tune.job.entry import run_trial

    return run_trial(spec)


def slurm_batch_payload(specs: list[TrialSpec]) -> list[TrialResult]:
    """SLURM executor, a batch: every task is one rank of every trial, run one after
    another in the same processes; each result is written to its ``result_path`` the
    moment the trial ends (the orchestrator polls those), and all come back at the end."""
    from hcp_tune.job.entry import run_batch

    return run_batch(specs)


def steps_payload(specs: list[TrialSpec], launch, workdir: str) -> list[TrialResult]:
    """``executor.batch=steps``: the job's one driver process runs each trial as its own
    process set (``launch``: a ``job.steps.StepLaunch`` for srun job steps; None: local
    processes), in order, each result written to its ``result_path`` as its step ends."""
    from hcp_tune.job.steps import run_steps

    return run_steps(specs, launch, workdir)
