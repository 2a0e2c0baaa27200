"""What settles an inconclusive ``regress``: the sweep command printed for each (key, tag)
(``settle_plan``, ``sweep_command``), and ``regress ... settle=true``, which runs them until
every layout is confirmed or cleared or the cap is reached, so a nightly job ends with a
verdict.

Each round compares the stored rows, takes ``regress.settle_plan`` (per key and tag, the
``search.repeats`` that would likely settle its inconclusive layouts), runs those sweeps
(a sweep resumes: only the missing trials are measured) and compares again. The candidate
is measured in this environment (plus ``candidate_args``); the baseline only when its
environment is still given (``baseline_args``, e.g. its container image), since trials
measured in the candidate's environment under the baseline's tag would be a lie. It stops
when nothing is inconclusive, when a layout needs more than ``max_trials`` trials per tag
(the change is about the size of the bound), or when a round could add nothing.

The sweeps are run by a callable (``run_sweep(args) -> exit code``): the CLI runs
``python -m hcp_tune sweep ...`` as a child process, so ``regress`` itself still imports
no torch; the tests pass a function that appends recorded rows.
"""
from __future__ import annotations

from typing import Callable, Optional

from hcp_tune.errors import EXIT_USAGE
from hcp_tune.outputs.regress import (
    COMPARED,
    OLDER_ROW_DEFAULTS,
    Comparison,
    Options,
    RegressError,
    compare,
)

MAX_ROUNDS = 10  # a bound on the loop: each round raises some key's repeats, capped too


def sweep_args(key: tuple, tag: str, repeats: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The sweep that brings a key's layouts under ``tag`` to ``repeats`` trials each (a
    sweep resumes: it measures only the trials not yet stored). ``extra`` overrides go
    first, the key and tag last, so they cannot move the sweep to another key."""
    given = dict(zip(COMPARED, key))
    fields = [f"{k}={v}" for k, v in given.items()
              if k != "micro_batches" and v != OLDER_ROW_DEFAULTS.get(k)]
    m = given.get("micro_batches") or 1
    if m != 1:  # the key's micro-batches per step come from the global batch: gbs/(mbs*dp)
        fields.append(f"gbs={m * (given.get('mbs') or 1) * (given.get('dp') or 1)}")
    return ["sweep", *extra, *fields, f"env_tag={tag}", f"search.repeats={repeats}",
            "search.early_stop=false"]


def sweep_command(key: tuple, tag: str, repeats: int) -> str:
    return "python -m hcp_tune " + " ".join(sweep_args(key, tag, repeats))


def settle_plan(report: Comparison) -> list[tuple[tuple, str, int]]:
    """(key, tag, search.repeats) for every key with a layout that can be settled within
    ``max_trials``: the repeats count every stored trial of the layout, so the sweep adds
    ``needed`` usable ones (a trial that fails again is counted, not retried)."""
    o = report.options
    plan = []
    for k in report.keys:
        for i, tag in enumerate((o.baseline, o.candidate)):
            want = [c.needed + c.stored[i] - len(c.cand_s if i else c.base_s)
                    for c in k.layouts if c.inconclusive and c.needed]
            if want:
                plan.append((k.key, tag, max(want)))
    return plan



def settle(load_rows: Callable[[], list[dict]], run_sweep: Callable[[list[str]], int],
           opts: Options, *, candidate_args: list[str],
           baseline_args: Optional[list[str]] = None,
           say: Callable[[str], None] = print) -> tuple[Comparison, list[str]]:
    """The final comparison and one line per sweep run (its arguments and exit code). A
    sweep that refuses its input is a ``RegressError`` (exit 2); one that fails otherwise
    stops the settling with a warning in the report."""
    report = compare(load_rows(), opts)
    asked: dict[tuple, int] = {}
    log: list[str] = []
    for _ in range(MAX_ROUNDS):
        plan = []
        for key, tag, repeats in settle_plan(report):
            extra = candidate_args if tag == opts.candidate else baseline_args
            repeats = min(repeats, opts.max_trials)
            if extra is None or asked.get((key, tag), 0) >= repeats:
                continue  # the baseline's environment is gone, or nothing more to ask
            plan.append((key, tag, repeats, extra))
        if not plan:
            break
        for key, tag, repeats, extra in plan:
            args = sweep_args(key, tag, repeats, tuple(extra))
            say(f"settle: python -m hcp_tune {' '.join(args)}")
            rc = run_sweep(args)
            log.append(f"{' '.join(args)}: exit {rc}")
            if rc == EXIT_USAGE:
                raise RegressError(
                    f"settle: `python -m hcp_tune {' '.join(args)}` refused its input (exit "
                    f"{rc}, its error above); fix candidate_args=/baseline_args= (they go to "
                    "every such sweep) and run regress again: stored trials are kept")
            if rc != 0:
                report = compare(load_rows(), opts)
                report.warnings.append(f"settle stopped: the sweep `python -m hcp_tune "
                                       f"{' '.join(args)}` exited {rc}; the verdicts are from "
                                       "the trials stored so far")
                return report, log
            asked[(key, tag)] = repeats
        report = compare(load_rows(), opts)
    return report, log
