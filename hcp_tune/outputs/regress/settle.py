"""What settles an inconclusive ``regress``: the sweep command printed for each (key, tag)
(``settle_plan``, ``sweep_command``), and ``regress ... settle=true``, which runs them until
every layout is confirmed or cleared or the cap is reached, so a nightly job ends with a
verdict.

**Group-sequential design.** Each comparison of the loop is a look at the data; looking
again after more trials and stopping at the first flag would inflate the false-alarm rate.
So look ``k`` may spend only ``stats.look_alpha(t_k, t_{k-1})`` of the family-wise rate,
with ``t`` the information fraction (the most trials per tag of a layout / ``max_trials``)
and Lan-DeMets' O'Brien-Fleming spending function: early looks spend almost nothing (only
a large change is confirmed on few trials), the spent increments add up to ``alpha`` at
most, so by Bonferroni over the looks the rate over all looks stays within ``alpha``.

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

from hcp_tune.store.records import key_args
from hcp_tune.errors import EXIT_USAGE
import hcp_tune.outputs.regress.stats as stats
from hcp_tune.outputs.regress.model import COMPARED, Comparison, Options, compare
from hcp_tune.outputs.regress.rows import RegressError

MAX_ROUNDS = 10  # a bound on the loop: each round raises some key's repeats, capped too


def sweep_args(key: tuple, tag: str, repeats: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The sweep that brings a key's layouts under ``tag`` to ``repeats`` trials each (a
    sweep resumes: it measures only the trials not yet stored). ``extra`` overrides go
    first, the key and tag last, so they cannot move the sweep to another key."""
    fields = key_args(dict(zip(COMPARED, key)))
    return ["sweep", *extra, *fields, f"env_tag={tag}", f"search.repeats={repeats}",
            "search.purpose=regress"]


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


def information(report: Comparison) -> float:
    """The look's information fraction: the most trials per tag of a layout / max_trials."""
    n = max((min(len(c.base_s), len(c.cand_s)) for c in report.comparisons), default=0)
    return min(1.0, n / report.options.max_trials)


def settle(load_rows: Callable[[], list[dict]], run_sweep: Callable[[list[str]], int],
           opts: Options, *, candidate_args: list[str],
           baseline_args: Optional[list[str]] = None,
           say: Callable[[str], None] = print) -> tuple[Comparison, list[str]]:
    """The final comparison and one line per sweep run (its arguments and exit code). A
    sweep that refuses its input is a ``RegressError`` (exit 2); one that fails otherwise
    stops the settling with a warning in the report."""
    t_seen: list[float] = []

    def look() -> Comparison:
        rows = load_rows()
        t = information(compare(rows, opts))
        before = t_seen[-1] if t_seen else 0.0
        t_seen.append(max(t, before))
        report = compare(rows, opts, alpha=max(stats.look_alpha(t, before, opts.alpha), 1e-12))
        report.warnings.append(
            f"settle look {len(t_seen)}: {t:.2f} of the information of max_trials="
            f"{opts.max_trials}; this look spends {report.alpha:.2g} of the family-wise rate "
            f"{opts.alpha:g} (O'Brien-Fleming alpha spending, "
            f"{stats.obf_spent(t_seen[-1], opts.alpha):.2g} spent so far)")
        return report

    report = look()
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
            say("settle:")
            say(f"  python -m hcp_tune {' '.join(args)}")  # the command alone, whole
            rc = run_sweep(args)
            log.append(f"{' '.join(args)}: exit {rc}")
            if rc == EXIT_USAGE:
                raise RegressError(
                    f"settle: `python -m hcp_tune {' '.join(args)}` refused its input (exit "
                    f"{rc}, its error above); fix candidate_args=/baseline_args= (they go to "
                    "every such sweep) and run regress again: stored trials are kept")
            if rc != 0:
                report = look()
                report.warnings.append(f"settle stopped: the sweep `python -m hcp_tune "
                                       f"{' '.join(args)}` exited {rc}; the verdicts are from "
                                       "the trials stored so far")
                return report, log
            asked[(key, tag)] = repeats
        report = look()
    return report, log
