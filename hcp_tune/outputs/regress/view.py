"""How a ``regress`` comparison is shown: the terminal table (rich, at ``$COLUMNS``, 100 by
default, verdicts never cut) and the Markdown file. The HTML page with plots is
``hcp_tune/outputs/html_report.py``; every number and verdict comes from ``model.py``.
"""
from __future__ import annotations

from typing import Optional

from hcp_tune.outputs.regress.model import Comparison, LayoutComparison
from hcp_tune.outputs.regress.rates import rate_line
from hcp_tune.outputs.regress.rows import COMPARED, key_text
from hcp_tune.outputs.regress.settle import settle_plan, sweep_command
from hcp_tune.outputs.regress.stats import Estimate

HEADERS = ("key", "layout", "n b/c", "base s", "ratio", "vs shift", "interval", "verdict",
           "mem", "mem verdict")
TERM_HEADERS = ("layout", "n", "ratio", "vs shift", "interval", "verdict", "memory")
VERDICT = {"regression": "REGRESSION", "improvement": "UNEXPECTED SPEED-UP",
           "failing": "FAILING (no ok trial)", "ok": "ok", "inconclusive": "INCONCLUSIVE",
           "n/a": "n/a"}


def fmt(v: Optional[float], spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def verdict_text(c: LayoutComparison) -> str:
    if c.verdict == "inconclusive":
        return f"INCONCLUSIVE ~{c.needed}/tag" if c.needed else "INCONCLUSIVE"
    return VERDICT[c.verdict]


def mem_text(c: LayoutComparison) -> str:
    said = VERDICT[c.mem_verdict]
    return said.replace("SPEED-UP", "SHRINK") if c.mem_verdict == "improvement" else said


def cells(c: LayoutComparison) -> list[str]:
    """One row: the key, the layout, trials, the baseline's median, the whole change, the
    judged estimate (the deviation from the common shift) and its interval, the verdicts."""
    med = sorted(c.base_s)[len(c.base_s) // 2] if c.base_s else None
    lo, hi = c.ci
    dev = c.est.ratio() if c.est else None
    return [key_text(c.key), f"{c.layout} {c.comm_type}".strip(),
            f"{len(c.base_s)}/{len(c.cand_s)}", fmt(med), fmt(c.ratio, ".3f"),
            fmt(dev, ".3f"), f"{fmt(lo, '.3f')}-{fmt(hi, '.3f')}" if lo is not None else "-",
            verdict_text(c), fmt(c.mem_ratio, ".3f"), mem_text(c)]


def term_cells(c: LayoutComparison) -> list[str]:
    """The terminal's narrower row (100 columns): the layout, trials per tag, the whole
    change, the judged estimate with its interval, the verdict, memory's ratio and verdict."""
    full = cells(c)
    n = f"{len(c.base_s)}" if len(c.base_s) == len(c.cand_s) else full[2]
    memory = "n/a" if c.mem_verdict == "n/a" else f"{full[8]} {full[9]}"
    return [full[1], n, full[4], full[5], full[6], full[7], memory]


def shift_lines(report: Comparison) -> list[str]:
    """The common shift of each metric: the release-wide verdict (or why there is none)."""
    o = report.options
    if not report.shifts:
        return [f"common shift: not separated ({len(report.comparisons)} layout(s); "
                "3 or more are needed): each layout is judged on its whole change"]
    cause = ("the tags were interleaved: the session effect cancels" if o.design == "interleaved"
             else "one session per tag: this shift holds the session effect as well as the "
             "release's")
    out = []
    for name, e in report.shifts:
        lo, hi = e.ratio_interval(o.ci)
        limit = o.threshold if name == "step time" else o.mem_threshold
        read = (f"read from the {report.shift_from} of {len(report.comparisons)} layouts "
                "at the level most plausibly unchanged" if name == "step time"
                and 0 < report.shift_from < len(report.comparisons)
                else f"over {len(report.comparisons)} layouts")
        out.append(f"common shift of {name} {read}: ratio "
                   f"{e.ratio():.3f} [{lo:.3f}, {hi:.3f}] -> {_shift_verdict(e)} "
                   f"(threshold {pct(limit)}; {cause})")
    return out


def shift_advice(report: Comparison) -> list[str]:
    """Why an inconclusive shift of step time needs another design, not more trials."""
    e, sp = report.shift, report.spread
    if e is None or e.verdict != "inconclusive" or sp is None:
        return []
    return [f"the common shift of step time is inconclusive: two sessions may differ by "
            f"N(0, 2 S^2) (S={sp.session * 100:.2g}%), which no number of trials in these "
            "sessions narrows; measure both tags in one allocation (regress run) or the "
            "baseline again beside the candidate"]


def spread_line(report: Comparison) -> str:
    """The session spreads the verdicts allowed for, and where they came from."""
    sp = report.spread
    if sp is None:
        return ("session spread: not used (the tags' trials were interleaved in one "
                "session: its effect cancels in each pair)")
    return (f"{sp.text()}: the tags' common shift may differ by N(0, 2 S^2) and each layout "
            "by N(0, 2 L^2) more with no release change; a real spread larger than these "
            "raises false alarms: give session_spread= layout_spread=")


NAMED_SHARE = 0.75  # a path is named when its layouts flagged are at least this share of it
# (a set of layouts sharing a level, its name): the layout levels first, then key fields
PATHS = (("a2a > 1", lambda c: c.a2a > 1, "the all-to-all path"),
         ("p2p > 1", lambda c: c.p2p > 1, "the ring (p2p) path"),
         ("a2a = 1", lambda c: c.a2a == 1, "the pure ring layouts"),
         ("p2p = 1", lambda c: c.p2p == 1, "the pure all-to-all layouts"))


def _descriptions(layouts: list[LayoutComparison]):
    yield from PATHS
    for level in ("a2a", "p2p"):
        for value in sorted({getattr(c, level) for c in layouts}):
            yield (f"{level}={value}", lambda c, f=level, v=value: getattr(c, f) == v,
                   f"{level}={value}")
    for i, name in enumerate(COMPARED):
        for value in sorted({c.key[i] for c in layouts}, key=str):
            yield (f"{name}={value}", lambda c, i=i, v=value: c.key[i] == v, f"{name}={value}")


def shared_levels(report: Comparison) -> list[str]:
    """Where the layouts flagged in one direction all belong to one path or key field and
    make up most of it (``NAMED_SHARE``), one line that names it: the smallest such set,
    with the whole change of every layout in it (e.g. "every layout with a2a > 1 slowed
    6-8% (36 of 36 confirmed): the all-to-all path")."""
    judged = [c for c in report.comparisons if c.est is not None]
    out = []
    for verdict, verb in (("regression", "slowed"), ("improvement", "sped up")):
        hit = {id(c) for c in judged if c.verdict == verdict}
        if len(hit) < 2:
            continue
        fits = []
        for text, test, name in _descriptions(judged):
            members = [c for c in judged if test(c)]
            if (hit <= {id(c) for c in members} and len(members) < len(judged)
                    and len(hit) >= NAMED_SHARE * len(members)):
                fits.append((len(members), text, name, members))
        if fits:
            _, text, name, members = min(fits, key=lambda f: f[0])
            sizes = sorted(abs(c.ratio - 1) * 100 for c in members)
            span = (f"{sizes[0]:.0f}%" if round(sizes[0]) == round(sizes[-1])
                    else f"{sizes[0]:.0f}-{sizes[-1]:.0f}%")
            out.append(f"every layout with {text} {verb} {span} ({len(hit)} of "
                       f"{len(members)} confirmed): {name}")
    return out


def _shift_verdict(e: Estimate) -> str:
    return {"regression": "REGRESSION of the release", "improvement":
            "UNEXPECTED SPEED-UP of the release"}.get(e.verdict, VERDICT[e.verdict])


def winner_lines(report: Comparison) -> list[str]:
    out = []
    for k in report.keys:
        if k.winner_changed:
            tie = " (within noise: a tie)" if k.winner_tie else ""
            out.append(f"winner changed for {k.name}: {k.base_winner} -> {k.cand_winner}{tie}")
    return out


SETTLE_WHY = ("to settle (80% power at the observed change; a sweep resumes: only the missing "
              "trials run; add the executor/container overrides the sweep ran with; or "
              "regress ... settle=true)")


def next_steps(report: Comparison) -> list[str]:
    """What settles the inconclusive layouts, and why memory was not judged where it was
    not (the files' form: each command after its reason, on one line)."""
    return ([f"{SETTLE_WHY}: {sweep_command(key, tag, n)}"
             for key, tag, n in settle_plan(report)] + other_steps(report))


def terminal_steps(report: Comparison) -> list[str]:
    """``next_steps`` for the terminal (``ui.say``): the reason once, wrapped at the width,
    then each command on a line of its own (two spaces in front: printed whole)."""
    plan = settle_plan(report)
    return ([f"{SETTLE_WHY}, run:"] if plan else []) + [
        f"  {sweep_command(key, tag, n)}" for key, tag, n in plan] + other_steps(report)


def other_steps(report: Comparison) -> list[str]:
    """The next steps besides the settle commands: the layouts no trial count settles, and
    why memory was not judged."""
    o = report.options
    out = []
    for c in report.inconclusive:
        if not c.needed:
            out.append(f"{key_text(c.key)} {c.layout}: inconclusive, and the change is about "
                       f"the size of the threshold ({pct(o.threshold)}): more than "
                       f"{o.max_trials} trials per tag would be needed (max_trials=)")
    reasons: dict[str, list[str]] = {}
    for c in report.comparisons:
        if c.mem_verdict == "n/a" and c.mem_reason:
            reasons.setdefault(c.mem_reason, []).append(c.layout)
    out += [f"memory not judged for {', '.join(layouts)}: {why}"
            for why, layouts in reasons.items()]
    return out


def rate_text(report: Comparison) -> str:
    """The error rate the verdicts control, as every summary states it."""
    return (f"family-wise error rate {report.alpha:.2g} (Holm over {report.tests} tests: "
            "the chance that anything unchanged is flagged)")


def summary_line(report: Comparison) -> str:
    o = report.options
    flagged, unsure, n = report.flagged, report.inconclusive, len(report.comparisons)
    what = (f"{len(flagged)} of {n} key/layout(s) flagged" if flagged
            else f"no confirmed change in {n} key/layout(s)" if unsure
            else f"no regression in {n} key/layout(s)")
    if report.shift_flagged:
        what += "; " + ", ".join(f"common {name} shift {VERDICT[e.verdict]} x{e.ratio():.3f}"
                                 for name, e in report.shift_flagged)
    if unsure:
        what += f"; {len(unsure)} inconclusive (measure more)"
    design = "interleaved ABBA" if o.design == "interleaved" else "one session per tag"
    return (f"regress {o.baseline} -> {o.candidate}: {what} (threshold {pct(o.threshold)}, "
            f"memory {pct(o.mem_threshold)}, {rate_text(report)}; design: {design}; "
            f"exit {report.exit_code})")


def print_report(report: Comparison, written: list[str], known: Optional[dict] = None) -> None:
    """One table per key (the key is its title), then plain lines a script can grep; the
    verdict columns are never wrapped or cut, the others fold to fit the width. ``known``
    (``known.match``): a flagged layout's upstream cause, printed beside its verdict."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from hcp_tune.outputs.ui import console, say

    out = console()
    o = report.options
    for k in report.keys:
        table = Table(title=escape(f"{o.baseline} -> {o.candidate}: {k.name}"),
                      box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        rows = [term_cells(c) for c in k.layouts]
        for i, h in enumerate(TERM_HEADERS):
            keep = h != "layout"  # numbers and verdicts whole; the layout may fold
            width = max([len(h)] + [len(r[i]) for r in rows]) if keep else None
            table.add_column(escape(h), no_wrap=keep, min_width=width, overflow="fold")
        for c, row in zip(k.layouts, rows):
            table.add_row(*map(escape, row), style="bold red" if c.flagged else
                          "yellow" if c.inconclusive else None)
        out.print(table)
    say(*(known_lines(report, known or {}) + shift_lines(report) + shared_levels(report)
          + [spread_line(report)] + shift_advice(report) + winner_lines(report)))
    say(*terminal_steps(report))  # prose wrapped; each command alone, whole
    say(*[f"warning: {w}" for w in report.warnings], f"method: {report.method}",
        rate_line(report.options.design), summary_line(report))
    say(*(f"wrote {path}" for path in written))  # a long path goes on a line of its own


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def known_lines(report: Comparison, known: dict) -> list[str]:
    """Each flagged layout with a known upstream cause (``known.py``): its verdict, then
    "known: <issue>: <cause>"; the verdict and the exit code are unchanged."""
    from hcp_tune.outputs.regress.known import lines

    return lines(report, known, verdict_text)


def markdown(report: Comparison, known: Optional[dict] = None) -> str:
    lines = [f"# Regression: {report.options.baseline} (baseline) vs "
             f"{report.options.candidate} (candidate)", "", summary_line(report), ""]
    lines += ["## Common shift", ""] + [f"- {_md_escape(x)}" for x in shift_lines(report)
                                        + shared_levels(report) + [spread_line(report)]
                                        + shift_advice(report)]
    lines.append("")
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {_md_escape(w)}" for w in report.warnings] + [""]
    if known:
        lines += ["## Known upstream causes", ""] + [
            f"- {_md_escape(x)}" for x in known_lines(report, known)] + [""]
    steps = next_steps(report)
    if steps:
        lines += ["## Next steps", ""] + [f"- {_md_escape(x)}" for x in steps] + [""]
    lines += ["## Winners", ""]
    for k in report.keys:
        mark = " **changed**" + (" (tie)" if k.winner_tie else "") if k.winner_changed else ""
        lines.append(f"- {k.name}: {k.base_winner} -> {k.cand_winner}{mark}")
    if not winner_lines(report):
        lines += ["", "No key's winning layout changed."]
    lines += ["", "## Per key and layout", "",
              "`ratio`: the layout's whole change; `vs shift`: its deviation from the common "
              "shift (what is judged when a shift is separated), with its interval.", "",
              "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for c in report.comparisons:
        lines.append("| " + " | ".join(_md_escape(x) for x in cells(c)) + " |")
    lines += ["", "## Method", "", report.method + ".", "", rate_line(report.options.design),
              ""]
    return "\n".join(lines)

