"""How a ``regress`` comparison is shown: the terminal table (rich) and the Markdown file.

The HTML page with plots is ``hcp_tune/outputs/html_report.py``; the numbers and verdicts all come
from ``hcp_tune/outputs/regress.py``. Each table row is one key and layout.
"""
from __future__ import annotations

from typing import Optional

from hcp_tune.noise import percentile
from hcp_tune.outputs.regress import METHOD, Comparison, LayoutComparison, key_text
from hcp_tune.outputs.regress_settle import settle_plan, sweep_command

HEADERS = ("key", "layout", "trials b/c", "baseline s", "candidate s", "ratio", "interval",
           "noise", "verdict", "mem ratio", "mem")


def fmt(v: Optional[float], spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def verdict_text(c: LayoutComparison) -> str:
    if c.inconclusive:
        return (f"INCONCLUSIVE (~{c.needed} trials/tag)" if c.needed else
                "INCONCLUSIVE (change about the bound)")
    return {"regression": "REGRESSION", "improvement": "UNEXPECTED IMPROVEMENT",
            "failing": "FAILING (no ok trial)"}.get(c.verdict, "ok")


def cells(c: LayoutComparison) -> list[str]:
    med = lambda xs: percentile(xs, 50) if xs else None  # noqa: E731
    lo, hi = c.ci
    return [key_text(c.key), f"{c.layout} {c.comm_type}", f"{len(c.base_s)}/{len(c.cand_s)}",
            fmt(med(c.base_s)), fmt(med(c.cand_s)), fmt(c.ratio, ".3f"),
            f"{fmt(lo, '.3f')}-{fmt(hi, '.3f')}" if lo is not None else "-",
            pct(c.noise_floor), verdict_text(c), fmt(c.mem_ratio, ".3f"),
            {"regression": "MEM REGRESSION"}.get(c.mem_verdict, c.mem_verdict)]


def winner_lines(report: Comparison) -> list[str]:
    out = []
    for k in report.keys:
        if k.winner_changed:
            tie = " (within noise: a tie)" if k.winner_tie else ""
            out.append(f"winner changed for {k.name}: {k.base_winner} -> {k.cand_winner}{tie}")
    return out


def next_steps(report: Comparison) -> list[str]:
    """What settles the inconclusive layouts, and why memory was not judged where it was not."""
    o = report.options
    out = [f"to settle, measure more (a sweep resumes: only the missing trials run; add the "
           f"executor/container overrides the sweep ran with; or regress ... settle=true): "
           f"{sweep_command(key, tag, n)}" for key, tag, n in settle_plan(report)]
    for c in report.inconclusive:
        if not c.needed:
            out.append(f"{key_text(c.key)} {c.layout}: inconclusive, and the change is about "
                       f"the size of the bound ({pct(c.bound)}): more than {o.max_trials} "
                       "trials per tag would likely be needed (max_trials=)")
    reasons: dict[str, list[str]] = {}
    for c in report.comparisons:
        if c.mem_verdict == "n/a" and c.mem_reason:
            reasons.setdefault(c.mem_reason, []).append(c.layout)
    out += [f"memory not judged for {', '.join(layouts)}: {why}"
            for why, layouts in reasons.items()]
    return out


def summary_line(report: Comparison) -> str:
    o = report.options
    flagged, unsure, n = report.flagged, report.inconclusive, len(report.comparisons)
    what = (f"{len(flagged)} of {n} key/layout(s) flagged" if flagged
            else f"no confirmed change in {n} key/layout(s)" if unsure
            else f"no regression in {n} key/layout(s)")
    if unsure:
        what += f"; {len(unsure)} inconclusive (measure more)"
    return (f"regress {o.baseline} -> {o.candidate}: {what} (threshold {pct(o.threshold)}, "
            f"{o.ci * 100:g}% interval, memory {pct(o.mem_threshold)}; exit {report.exit_code})")


def print_report(report: Comparison, written: list[str]) -> None:
    """One rich table per key (the key is its title), then plain lines a script can grep."""
    from rich.table import Table

    from hcp_tune.outputs.ui import console

    out = console()
    o = report.options
    for k in report.keys:
        table = Table(title=f"{o.baseline} -> {o.candidate}: {k.name}")
        for h in HEADERS[1:]:
            table.add_column(h)
        for c in k.layouts:
            table.add_row(*cells(c)[1:], style="bold red" if c.flagged else
                          "yellow" if c.inconclusive else None)
        out.print(table)
    for line in (winner_lines(report) + next_steps(report)
                 + [f"warning: {w}" for w in report.warnings]):
        print(line)
    print(f"method: {METHOD}")
    print(summary_line(report))
    for path in written:
        print(f"wrote {path}")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(report: Comparison) -> str:
    o = report.options
    lines = [f"# Regression: {o.baseline} (baseline) vs {o.candidate} (candidate)", "",
             summary_line(report), ""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {_md_escape(w)}" for w in report.warnings] + [""]
    steps = next_steps(report)
    if steps:
        lines += ["## Next steps", ""] + [f"- {_md_escape(x)}" for x in steps] + [""]
    changed = winner_lines(report)
    lines += ["## Winners", ""]
    for k in report.keys:
        mark = " **changed**" + (" (tie)" if k.winner_tie else "") if k.winner_changed else ""
        lines.append(f"- {k.name}: {k.base_winner} -> {k.cand_winner}{mark}")
    if not changed:
        lines.append("")
        lines.append("No key's winning layout changed.")
    lines += ["", "## Per key and layout", "",
              "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for c in report.comparisons:
        lines.append("| " + " | ".join(_md_escape(x) for x in cells(c)) + " |")
    lines += ["", "## Method", "", METHOD + f"; memory threshold {pct(o.mem_threshold)}, "
              f"bootstrap seed {o.seed}.", ""]
    return "\n".join(lines)
