"""``regress power`` (how many trials per tag a change needs) and ``regress run`` (both tags
measured interleaved, ABBA, so that the session effect and a linear drift cancel).

``regress power effect=0.07 [noise=0.02] [layouts=48] [threshold=0.05] [alpha=0.05]``
prints the trials per tag that confirm a change of ``effect`` with 80% power under the
rule ``regress`` applies (``stats.trials_for_power``: the rule itself run on simulated
nights of ``layouts`` layouts, one in eight changed, time and memory in one Holm family);
the noise, when not given, is the pooled per-trial spread of the stored trials
(``results_dir``, the tags given).
``benchmarks/regress_error_rates.py`` checks the answer by simulating the rule itself.

``regress run baseline=A candidate=B baseline_args='...' candidate_args='...' trials=5``
alternates the two tags round by round (``run_order``: ABBA): round r runs one sweep of each
tag to ``search.repeats=r`` (each adds one trial of every layout of the key), A first in odd
rounds and B first in even ones, so A's and B's r-th trials run back to back and a linear
drift favours neither. Run it inside one allocation (``salloc``/``sbatch`` with
``executor=local``, or the te_regression preset's ``executor=local`` overrides) and both
tags share the nodes too; with ``executor=slurm`` each sweep submits its own jobs and only
the time drift cancels. The analysis pairs the r-th trials (``design=interleaved``), by
their position in the key's plan: a failed trial drops its own pair only.
"""
from __future__ import annotations

import math
from pathlib import Path

import hcp_tune.outputs.regress.stats as stats
from hcp_tune.outputs.regress.args import (
    OPTION_KEYS,
    _flag,
    _number,
    _rows,
    options,
    parse_args,
    run_sweep,
    split_args,
    write_report,
)
from hcp_tune.outputs.regress.rows import RegressError, row_key, usable

POWER_KEYS = ("effect", "noise", "layouts", "threshold", "alpha", "results_dir", "baseline",
              "candidate")
RUN_KEYS = OPTION_KEYS + ("baseline_args", "candidate_args", "trials", "analyse_only")
RUN_TRIALS_MAX = 100


def _fraction(a: dict[str, str], key: str, default: float, lo: float, hi: float,
              what: str) -> float:
    value = _number(a, key, default)
    if not (math.isfinite(value) and lo < value < hi):
        raise RegressError(f"{key}={a.get(key, default)}: expected {what}")
    return value


def stored_noise(results_dir: Path, tags: set[str]) -> float:
    """The typical per-trial relative spread of step time: the pooled standard deviation of
    log step time over every (key, layout, tag) with 2 or more usable trials."""
    groups: dict[tuple, list[float]] = {}
    for r in _rows(results_dir, tags or None):
        if usable(r) and (not tags or str(r.get("env_tag")) in tags):
            groups.setdefault((row_key(r), r["a2a"], r.get("env_tag")), []).append(
                math.log(float(r["median_s"])))
    var, df = [], []
    for logs in groups.values():
        if len(logs) >= 2:
            m = sum(logs) / len(logs)
            var.append(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
            df.append(len(logs) - 1)
    if not var:
        raise RegressError(f"noise= not given and results_dir={results_dir} holds no layout "
                           "with 2 or more ok trials to read it from; give noise=0.02 (2%)")
    return math.sqrt(sum(v * d for v, d in zip(var, df)) / sum(df))


def cmd_power(args: list[str]) -> int:
    a = parse_args("regress power", args, POWER_KEYS)
    if "effect" not in a:
        raise RegressError("regress power needs effect=, the change to detect as a fraction, "
                           "e.g. regress power effect=0.07 noise=0.02")
    effect = _fraction(a, "effect", 0.07, -1, 10, "the change to detect, a fraction > -1 "
                       "and < 10, e.g. effect=0.07 (7% slower) or effect=-0.07 (7% faster)")
    threshold = _fraction(a, "threshold", 0.05, -1e-12, 1, "a fraction in [0, 1), e.g. "
                          "threshold=0.05")
    alpha = _fraction(a, "alpha", stats.ALPHA, 0, 0.5, "a fraction in (0, 0.5), e.g. "
                      "alpha=0.05")
    layouts = _number(a, "layouts", 48, int)
    if layouts < 1:
        raise RegressError(f"layouts={layouts}: expected the number of layouts compared, "
                           "an integer >= 1, e.g. layouts=48")
    if abs(effect) <= threshold:
        raise RegressError(f"effect={effect:g} is within the threshold ({threshold:g}): "
                           "regress confirms only changes beyond it; give a larger effect= or "
                           "a smaller threshold=")
    if "noise" in a:
        noise = _fraction(a, "noise", 0.02, 0, 10, "the per-trial relative spread, a "
                          "fraction > 0, e.g. noise=0.02 (2%)")
        source = "given"
    else:
        tags = {a[k] for k in ("baseline", "candidate") if k in a}
        noise = stored_noise(Path(a.get("results_dir", "results")).resolve(), tags)
        source = f"read from the stored trials{' of ' + ', '.join(sorted(tags)) if tags else ''}"
    tests = 2 * layouts + 2
    n = stats.trials_for_power(effect, noise, threshold, alpha, tests, layouts)
    head = (f"regress power: a {effect * 100:+.1f}% change, per-trial noise "
            f"{noise * 100:.2f}% ({source}), threshold {threshold * 100:.1f}%, family-wise "
            f"rate {alpha:g} over {tests} tests ({layouts} layouts, time and memory)")
    from hcp_tune.outputs.ui import say

    if n is None:
        say(f"{head}: more than 1000 trials per tag would be needed")
        return 0
    at = stats.simulated_power(n, effect, noise, threshold, alpha, layouts)
    say(f"{head}: {n} trials per tag give {at * 100:.0f}% power (80% wanted, simulated); "
        "measure each tag with", f"  search.repeats={n} search.purpose=regress")
    return 0


def run_order(baseline: str, candidate: str, trials: int) -> list[tuple[int, str]]:
    """(round, tag) in the order ``regress run`` sweeps them: ABBA (round r runs the
    baseline first when r is odd, the candidate first when r is even), so a drift through
    the allocation that is linear in time cancels over every two rounds instead of always
    favouring the tag that runs first."""
    return [(r, tag) for r in range(1, trials + 1)
            for tag in ((baseline, candidate) if r % 2 else (candidate, baseline))]


def cmd_run(args: list[str]) -> int:
    """Both tags measured round by round (ABBA), then the paired comparison."""
    import hcp_tune.outputs.regress.model as model

    from hcp_tune.outputs.ui import say

    a = parse_args("regress run", args, RUN_KEYS)
    opts = options(a, "interleaved")
    for key in ("baseline_args", "candidate_args"):
        if key not in a:
            raise RegressError(f"regress run needs {key}='...': the sweep overrides of that "
                               "tag's environment and the key, e.g. baseline_args='model="
                               "llama3-8b cp=4 executor.container_image=te-2.9.sqsh'")
    trials = _number(a, "trials", 5, int)
    if not model.MIN_TRIALS <= trials <= RUN_TRIALS_MAX:
        raise RegressError(f"trials={trials}: expected the trials per tag, an integer from "
                           f"{model.MIN_TRIALS} to {RUN_TRIALS_MAX}, e.g. trials=5")
    results_dir = Path(a.get("results_dir", "results")).resolve()
    extra = {opts.baseline: split_args(a, "baseline_args", results_dir),
             opts.candidate: split_args(a, "candidate_args", results_dir)}
    if not _flag(a, "analyse_only", False):
        for r, tag in run_order(opts.baseline, opts.candidate, trials):
            args_r = ["sweep", *extra[tag], f"env_tag={tag}", f"search.repeats={r}",
                      "search.purpose=regress"]
            say(f"regress run: round {r} of {trials}, {tag}:",  # the command alone, whole
                "  python -m hcp_tune " + " ".join(args_r))
            rc = run_sweep(args_r)
            if rc != 0:
                raise RegressError(
                    f"regress run: the sweep of {tag} in round {r} exited {rc} (its error "
                    "above); the trials stored so far are kept: fix it and run again (a "
                    "sweep resumes), or analyse them with analyse_only=true")
    rows = _rows(results_dir, {opts.baseline, opts.candidate})
    return write_report(model.compare(rows, opts), results_dir, rows)
