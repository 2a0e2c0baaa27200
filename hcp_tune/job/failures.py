"""How a trial's exception becomes a failure class, and the faults tests may inject.

``classify`` maps an exception to a ``FailureClass`` and its first meaningful line;
``EnvironmentProblem`` is what job code raises when the software or hardware a trial needs
is absent. ``FAULTS`` lists what ``TrialSpec.inject_fault`` accepts (tests only).
"""
from __future__ import annotations

from hcp_tune.spec import FAULTS, FailureClass, classify_error_text, first_error_line  # noqa: F401

KILL_EXIT_CODE = 17


class EnvironmentProblem(RuntimeError):
    """The software or hardware this trial needs is absent (FailureClass.ENVIRONMENT)."""


def classify(exc: BaseException) -> tuple[FailureClass, str]:
    from hcp_tune.job.bench import TimeLimitReached

    line = first_error_line(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeLimitReached):
        return FailureClass.TIME_LIMIT, line
    if type(exc).__name__ == "UncompletedJobError":  # submitit, on the executor's signal
        # (SLURM's or the local controller's USR2 shortly before executor.time_limit_min)
        return FailureClass.TIME_LIMIT, first_error_line(
            f"time limit: executor.time_limit_min is about to pass ({line})")
    if isinstance(exc, (EnvironmentProblem, ImportError)):
        return FailureClass.ENVIRONMENT, line
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return FailureClass.OOM, line
    return classify_error_text(f"{type(exc).__name__}: {exc}"), line
