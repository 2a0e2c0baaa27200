"""How a ``regress`` comparison is shown: the terminal table (rich) and the Markdown file.

The HTML page with plots is ``hcp_tune/outputs/html_report.py``; the numbers and verdicts all come
from ``hcp_tune/outputs/regress.py``. Each table row is one key and layout.
"""
from __future__ import annotations

from typing import Optional

from hcp_tune.noise import percentile
from hcp_tune.outputs.regress import METHOD, Comparison, LayoutComparison, key_text

HEADERS = ("key", "layout", "trials b/c", "baseline s", "candidate s", "ratio", "95% CI",
           "noise", "verdict", "mem ratio", "mem")


def fmt(v: Optional[float], spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def verdict_text(c: LayoutComparison) -> str:
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


def summary_line(report: Comparison) -> str:
    o = report.options
    flagged = report.flagged
    what = (f"{len(flagged)} of {len(report.comparisons)} key/layout(s) flagged"
            if flagged else f"no regression in {len(report.comparisons)} key/layout(s)")
    return (f"regress {o.baseline} -> {o.candidate}: {what} (threshold {pct(o.threshold)}, "
            f"memory {pct(o.mem_threshold)})")


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
            table.add_row(*cells(c)[1:], style="bold red" if c.flagged else None)
        out.print(table)
    for line in winner_lines(report) + [f"warning: {w}" for w in report.warnings]:
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
