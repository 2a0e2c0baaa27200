"""Job bodies for the dispatch tests: small picklable functions that run inside a job.

Pickled by value (see conftest), so a job does not need the tests folder on its path.
"""
from __future__ import annotations

import os


def double(x: int) -> int:
    return 2 * x


def boom(message: str) -> None:
    raise ValueError(message)


def block_on_fifo(path: str) -> str:
    """Waits for a writer that never comes: the job runs until cancelled or timed out."""
    with open(path) as f:  # opening a FIFO for reading blocks until a writer opens it
        return f.read()


def rank_report() -> dict:
    import submitit

    env = submitit.JobEnvironment()
    return {"global_rank": env.global_rank, "num_tasks": env.num_tasks, "pid": os.getpid()}
