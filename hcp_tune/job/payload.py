"""What a trial job unpickles and runs: the one function the orchestrator hands submitit,
under the local executor and under SLURM alike.

Every task of the job is one rank (``tasks_per_node`` = world size locally, ``ntasks`` =
world size on SLURM) and runs ``batch_payload``; task 0's return value is the job's
result. submitit pickles the payload function by reference, so the job process imports
the module that defines it before anything runs. Defined here, that is the job side only
(standard library, torch, Megatron-Core, TE, submitit); defined in the orchestrator's
modules it would drag hydra, optuna and pandas into the training container, where they
are usually absent.
"""
from __future__ import annotations

from hcp_tune.spec import TrialResult, TrialSpec


def batch_payload(specs: list[TrialSpec]) -> list[TrialResult]:
    """One rank of a job that runs ``specs`` (one world size) one after another in the same
    processes; each result is written to its ``result_path`` the moment the trial ends
    (the orchestrator polls those), and all come back at the end (``job.batch.run_batch``)."""
    from hcp_tune.job.batch import run_batch

    return run_batch(specs)


def steps_payload(specs: list[TrialSpec], launch, workdir: str) -> list[TrialResult]:
    """``executor.batch=steps``: the job's one driver process runs each trial as its own
    process set (``launch``: a ``job.steps.StepLaunch`` for srun job steps; None: local
    processes), in order, each result written to its ``result_path`` as its step ends."""
    from hcp_tune.job.steps import run_steps

    return run_steps(specs, launch, workdir)


def pool_payload(specs: list[TrialSpec], root: str, launch, fork: bool, owner: str = ""
                 ) -> list[TrialResult]:
    """``executor.keep_allocation``: the job's one driver process runs ``specs`` as its first
    process set, then each batch the orchestrator writes into ``root``, each in fresh
    processes (``launch``: srun steps; None: local processes; ``fork``: forked from the
    driver once it imported torch), until told to end or its sweep's marker ``owner`` is
    gone (``job.pool.run_pool``)."""
    from hcp_tune.job.pool import run_pool

    return run_pool(specs, root, launch, fork, owner)
