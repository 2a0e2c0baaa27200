"""User-facing error types and the exit codes the CLI maps them to.

Every error a user can cause is a ``ValueError`` subclass whose message is one line:
the key as the user wrote it, the value, the rule, and the fix. The CLI prints that
line and exits with the class's code; it never prints a traceback for these.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1  # validate found at least one error in the user's Bridge config
EXIT_USAGE = 2  # bad input: override, config file, profile, preset, missing file
EXIT_NOT_FOUND = 3  # recommend: no measured row for the asked key
EXIT_INCONCLUSIVE = 4  # regress: nothing confirmed, but a layout needs more trials to decide
EXIT_UNREACHABLE = 5  # sweep: SLURM was asked for but its controller does not answer


class HcpError(ValueError):
    """Base of every user-caused error; ``exit_code`` is what the CLI returns."""

    exit_code = EXIT_USAGE


class ConfigError(HcpError):
    """A config value (override, YAML file, cluster profile, model spec) is wrong."""


class InputFileError(HcpError):
    """A file the user named is missing, unreadable, or not of the expected shape."""


def one_line(text: str) -> str:
    """Collapse a message to a single line (error lines are grepped in job logs)."""
    return " ".join(str(text).split())
