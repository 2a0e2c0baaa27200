"""Terminal output: the one module that imports rich.

Tables go to stdout; when stdout is not a terminal the console is wide and colourless so
piped output stays greppable. Errors go to stderr as one plain line each.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

MAX_GROUPS_SHOWN = 4  # groups listed per level in the table; format=json lists them all


def console() -> Console:
    if sys.stdout.isatty():
        return Console()
    return Console(width=240, no_color=True, highlight=False, soft_wrap=False)


def error_line(message: str) -> None:
    for line in str(message).splitlines() or [""]:
        print(f"hcp-tune: error: {line}", file=sys.stderr)


def _groups(groups: list[list[int]]) -> str:
    shown = " ".join("{" + ",".join(map(str, g)) + "}" for g in groups[:MAX_GROUPS_SHOWN])
    more = len(groups) - MAX_GROUPS_SHOWN
    return shown + (f" +{more} more" if more > 0 else "")


def print_plan(plan: dict[str, Any]) -> None:
    rows = plan["candidates"]
    kept = sum(r["kept"] for r in rows)
    table = Table(
        title=f"plan: model={plan['model']} cluster={plan['cluster']} cp={plan['cp']} "
        f"({kept} kept, {len(rows) - kept} rejected)",
        show_lines=True,
    )
    for col in ("tp", "seq", "[a2a,p2p]", "comm", "status", "world", "nodes", "crosses",
                "a2a groups (level 0)", "p2p groups (level 1)", "why"):
        table.add_column(escape(col), overflow="fold")
    for r in rows:
        status = "kept" if r["kept"] else "rejected"
        why = "; ".join(r["reasons"] + [f"note: {f}" for f in r["flags"]]) or "-"
        table.add_row(
            str(r["tp"]), str(r["seq"]), escape(f"[{r['a2a']},{r['p2p']}]"), r["comm_type"],
            f"[green]{status}[/]" if r["kept"] else f"[red]{status}[/]",
            str(r["world_size"]), str(r["nodes"]), r["crosses_nodes"],
            _groups(r["groups"]["a2a"]), _groups(r["groups"]["p2p"]), escape(why),
        )
    console().print(table)


def print_findings(findings: Iterable[Any], source: str) -> None:
    findings = list(findings)
    out = console()
    if not findings:
        out.print(f"validate: {source}: no findings, the HCP settings are consistent")
        return
    table = Table(title=f"validate: {source}", show_lines=True)
    for col in ("severity", "rule", "found", "fix"):
        table.add_column(col, overflow="fold")
    style = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        table.add_row(
            f"[{style[f.severity]}]{f.severity}[/]", f.rule, escape(f.found), escape(f.fix or "-")
        )
    out.print(table)
    errors = sum(f.severity == "error" for f in findings)
    out.print(f"{errors} error(s), {len(findings) - errors} other finding(s)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def print_predict(pred: dict[str, Any]) -> None:
    """The cost model's table: every number PREDICTED, with the parameters' source."""
    rows = pred["candidates"]
    table = Table(
        title=f"PREDICTED (cost model, not measured): model={pred['model']} "
        f"cluster={pred['cluster']} cp={pred['cp']} mbs={pred['mbs']} {pred['dtype']}; "
        f"params: {pred['params_source']}",
        show_lines=False,
    )
    for col in ("tp", "seq", "rank", "[a2a,p2p]", "comm", "step ms (pred)", "vs best",
                "compute ms", "exposed a2a ms", "exposed p2p ms", "other ms",
                "memory GiB (pred)", "fits", "note"):
        table.add_column(escape(col), overflow="fold")
    for r in rows:
        b = r["breakdown_s"]
        fits = "yes" if r["fits_memory"] else f"[red]no (> {pred['gpu_memory_gib']:g})[/]"
        table.add_row(
            str(r["tp"]), str(r["seq"]), str(r["rank"]), escape(f"[{r['a2a']},{r['p2p']}]"),
            r["comm_type"], _ms(r["predicted_step_time_s"]), f"{r['vs_best']:.3f}x",
            _ms(b["compute_s"]), _ms(b["exposed_a2a_s"]), _ms(b["exposed_p2p_s"]),
            _ms(b["other_s"]), f"{r['predicted_memory_gib']:.1f}", fits,
            escape("; ".join(r["flags"])) or "-",
        )
    out = console()
    out.print(table)
    for r in pred["rejected"]:
        out.print(escape(f"rejected tp={r['tp']} seq={r['seq']} [{r['a2a']},{r['p2p']}]: "
                         + "; ".join(r["reasons"])))
    out.print(escape(f"every number above is {pred['label']}; measure with "
                     "`python -m hcp_tune sweep ...` on the cluster"))
