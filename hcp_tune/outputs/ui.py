"""Terminal output: the one module that imports rich.

Tables go to stdout. When stdout is not a terminal the console is colourless and
``$COLUMNS`` wide (``TABLE_WIDTH`` when unset), so piped output fits a terminal or a CI
log too: prose wraps between words, and a line a user copies whole (a command) is printed
with ``soft_wrap`` and never broken. Errors go to stderr as one plain line each.
"""
from __future__ import annotations

import os
import shutil
import sys
import textwrap
import time
from typing import Any, Iterable, Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hcp_tune.outputs import recommend
from hcp_tune.redact import redact

TABLE_WIDTH = 100  # every default table fits this many columns; the rest: format=json
MAX_GROUPS_SHOWN = 4  # groups listed per level in the table; format=json lists them all


def piped_width() -> int:
    """The width of output that is not a terminal: ``$COLUMNS`` when it is a positive
    number, else TABLE_WIDTH."""
    raw = os.environ.get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else TABLE_WIDTH


def console() -> Console:
    if sys.stdout.isatty():
        return Console()
    return Console(width=piped_width(), no_color=True, highlight=False, soft_wrap=False)


def unbroken_width(texts: Iterable[str], cap: int = 56) -> int:
    """The width a column needs so that no word of ``texts`` is folded (a paste-ready
    override such as ``"model.hierarchical_context_parallel_sizes=[2,4]"`` must copy
    whole), at most ``cap`` so the other columns keep room."""
    return min(cap, max((len(w) for t in texts for w in str(t).split()), default=1))


def hanging(text: str, head: str, width: int, indent: Optional[int] = None) -> str:
    """``head`` then ``text`` wrapped between words (never inside one) at ``width``, the
    lines after the first indented under the text (or by ``indent``)."""
    return textwrap.fill(str(text), width=width, initial_indent=head,
                         subsequent_indent=" " * (len(head) if indent is None else indent),
                         break_long_words=False, break_on_hyphens=False)


def stderr_width() -> int:
    """The width plain lines to stderr wrap at: the terminal's, else ``piped_width``."""
    if sys.stderr.isatty():
        return shutil.get_terminal_size((TABLE_WIDTH, 24)).columns
    return piped_width()


def say(*lines: str) -> None:
    """Lines of prose to stdout, each wrapped between words at the output's width (the
    continuation indented two); a line that starts with two spaces is a command or an
    override the user copies, and is printed whole."""
    out = console()
    for line in lines:
        whole = line.startswith("  ") or not line.strip()
        out.print(escape(line if whole else hanging(line, "", out.width, indent=2)),
                  soft_wrap=True)


def error_line(message: str) -> None:
    """The command's error, credentials removed (``hcp_tune.redact``): a message may
    quote what the user typed, a database URL with its password included."""
    for line in redact(str(message)).splitlines() or [""]:
        print(f"hcp-tune: error: {line}", file=sys.stderr)


def _groups(groups: list[list[int]]) -> str:
    shown = " ".join("{" + ",".join(map(str, g)) + "}" for g in groups[:MAX_GROUPS_SHOWN])
    more = len(groups) - MAX_GROUPS_SHOWN
    return shown + (f" +{more} more" if more > 0 else "")


def print_plan(plan: dict[str, Any]) -> None:
    """The layouts as a table of TABLE_WIDTH columns (why each is rejected or flagged, at
    word breaks), then each layout's rank groups on a line of its own (the first
    MAX_GROUPS_SHOWN per level; ``format=json`` lists every group)."""
    from rich import box

    rows = plan["candidates"]
    kept = sum(r["kept"] for r in rows)
    out = console()
    print_notes(plan)
    out.print(escape(f"plan: model={plan['model']} cluster={plan['cluster']} cp={plan['cp']} "
                     f"pp={plan['pp']} ({kept} kept, {len(rows) - kept} rejected)"))
    table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, show_lines=True)
    whys = ["; ".join(r["reasons"] + [f"note: {f}" for f in r["flags"]]) or "-" for r in rows]
    for col in ("tp", "seq", "[a2a,p2p]", "status", "world", "nodes", "crosses", "why"):
        table.add_column(escape(col), overflow="fold", ratio=1 if col == "why" else None,
                         min_width=unbroken_width(whys) if col == "why" else None,
                         justify="right" if col in ("tp", "seq", "world", "nodes") else "left")
    for r, why in zip(rows, whys):
        status = "kept" if r["kept"] else "rejected"
        table.add_row(
            str(r["tp"]), str(r["seq"]), escape(f"[{r['a2a']},{r['p2p']}]"),
            f"[green]{status}[/]" if r["kept"] else f"[red]{status}[/]",
            str(r["world_size"]), str(r["nodes"]), r["crosses_nodes"], escape(why),
        )
    out.print(table, width=TABLE_WIDTH)
    for r in rows:
        out.print(escape(f"groups tp={r['tp']} seq={r['seq']} [{r['a2a']},{r['p2p']}]: a2a "
                         f"{_groups(r['groups']['a2a'])} | p2p {_groups(r['groups']['p2p'])}"))
    if any(len(g) > MAX_GROUPS_SHOWN for r in rows for g in r["groups"].values()):
        out.print(f"(first {MAX_GROUPS_SHOWN} groups per level shown; format=json lists "
                  "every group)")
    if plan.get("estimate"):
        out.print(escape(f"sweep cost of the kept layouts: {plan['estimate']['text']}"))


def print_notes(data: dict[str, Any]) -> None:
    for line in data.get("notes", []):
        console().print(escape(f"note: {line}"))


def print_findings(findings: Iterable[Any], source: str) -> None:
    """One block per finding: its severity and rule, then what was found (wrapped between
    words at the console's width) and the fix on a line of its own, never broken, so a
    paste-ready override copies whole. ``format=json`` gives the same as data."""
    findings = list(findings)
    out = console()
    if not findings:
        out.print(f"validate: {source}: no findings, the HCP settings are consistent")
        return
    errors = sum(f.severity == "error" for f in findings)
    out.print(escape(f"validate: {source}"))
    style = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        out.print(f"\n[{style[f.severity]}]{f.severity}[/] [bold]{escape(f.rule)}[/]")
        out.print(escape(hanging(f.found, "  found: ", out.width)), soft_wrap=True)
        out.print(escape(f"  fix:   {f.fix or '-'}"), soft_wrap=True)
    out.print(f"\n{errors} error(s), {len(findings) - errors} other finding(s)")


class SweepReporter:
    """Live view of a sweep on a terminal; one plain line per event otherwise."""

    def __init__(self, live: Optional[bool] = None) -> None:
        self.live_mode = sys.stdout.isatty() if live is None else live
        self.rows: dict[str, list[str]] = {}
        self.best: dict[str, str] = {}
        self._live = None
        self.total = 0

    def start(self, total: int, summary: Any) -> None:
        self.total = total
        head = f"sweep: {total} trial(s) to run"
        if summary.resumed or summary.reattached:
            head += (f"; resumed: {summary.resumed} already stored, "
                     f"{summary.reattached} re-attached by job id")
        if summary.retried:
            head += (f"; measuring {summary.retried} stored failure(s) again "
                     f"(search.retry={summary.retry})")
        kept = summary.kept_failures_total()
        if kept:
            head += (f"; of those, {by_class_text(kept)} and are kept: search.retry=failed "
                     f"(or a class, e.g. search.retry={min(kept)}) measures them again")
        if total and getattr(summary, "estimate", ""):
            head += f"; {summary.estimate}"
        if getattr(summary, "adaptive_note", ""):
            head += f"; {summary.adaptive_note}"
        console().print(escape(head))
        if self.live_mode and total:
            from rich.live import Live

            self._live = Live(self._table(), console=console(), refresh_per_second=4)
            self._live.start()

    def trial(self, spec: Any, status: str, detail: str, best: Optional[dict] = None) -> None:
        layout = f"[{spec.a2a},{spec.p2p}]"
        key = f"tp={spec.tp} seq={spec.seq}"
        if best:
            self.best[key] = f"[{best['a2a']},{best['p2p']}] {best['median_s']:.4g} s"
        self.rows[spec.trial_id] = [spec.trial_id, key, layout, status, detail]
        if self._live is not None:
            self._live.update(self._table())
        else:
            stamp = time.strftime("%H:%M:%S")
            tail = f" (best so far {self.best[key]})" if key in self.best else ""
            say(f"[{stamp}] {spec.trial_id} {layout} {key}: {status} {detail}{tail}")

    def _table(self) -> Table:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            counts[r[3]] = counts.get(r[3], 0) + 1
        title = "sweep: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        table = Table(title=escape(title), caption=escape(
            "best so far: " + "; ".join(f"{k}: {v}" for k, v in self.best.items())))
        for col in ("trial", "key", "[a2a,p2p]", "status", "detail"):
            table.add_column(escape(col), overflow="fold")
        for r in self.rows.values():
            table.add_row(*(escape(x) for x in r))
        return table

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def print_sweep_runner(reason: str) -> None:
    """Why the sweep measures with another runner than asked (``runner_choice``)."""
    if reason:
        print(reason, file=sys.stderr)


def print_sweep_start(plan: Any) -> None:
    """The plan's notes and fit advice (``sweep_plan.SweepPlan``), before anything runs;
    the trial count and the estimate are the reporter's first line (``SweepReporter.start``)."""
    for line in plan.notes:  # the recipe followed; one stage measured when pp > 1
        print(hanging(f"sweep: {line}", "", stderr_width(), indent=2), file=sys.stderr)
    for line in plan.fit_advice:  # nothing fits: what would
        print(hanging(line, "", stderr_width(), indent=2), file=sys.stderr)


def print_sweep_end(summary: Any, recs: list[dict[str, Any]], results_dir: Any) -> None:
    """What the sweep stored, why it stopped early if it did, early stopping's savings,
    the ranking of this sweep's keys, and what was left unmeasured."""
    done = ", ".join(f"{v} {k}" for k, v in sorted(summary.by_status.items())) or "nothing new"
    print(f"sweep: stored {summary.stored} trial(s) ({done}); results in {results_dir}/")
    if summary.aborted:
        print(f"sweep: {summary.aborted}", file=sys.stderr)
    if summary.budget_stop:
        print(f"sweep: {summary.budget_stop}", file=sys.stderr)
    if summary.pruned:
        print(f"early stopping: {summary.pruned} trial(s) pruned, "
              f"{summary.pruned_saved_steps} measured step(s) not run")
    if recs:
        print_recommendations(recs, f"ranked: {results_dir}/recommendations.csv")
        say(*recommend.sweep_verdict_lines(recs, str(results_dir)))
    for line in unmeasured_lines(summary, {(r["tp"], r["seq"]) for r in recs},
                                 f"{results_dir}/trials.csv"):
        print(line, file=sys.stderr)


def unmeasured_lines(summary: Any, ranked: set, trials_csv: Any) -> list[str]:
    """What to tell the user about sweep keys left with no ranked layout: per key when
    some were measured, one verdict when none was, with the failures counted by class."""

    def merged(key) -> tuple[dict[str, int], int]:
        counts = dict(summary.failures.get(key, {}))
        kept = summary.kept_failures.get(key, {})
        for label, n in kept.items():
            counts[label] = counts.get(label, 0) + n
        return counts, sum(kept.values())

    missing = [k for k in summary.keys if (k.tp, k.seq) not in ranked]
    if not summary.keys:
        return ["sweep: nothing measured: no layout of this sweep is kept (see `python -m "
                "hcp_tune plan` with the same overrides for the reasons)"]
    lines, total, total_kept = [], {}, 0
    refused = [k for k in missing if (k.tp, k.seq) in set(summary.refused)]
    for key in refused:
        lines.append(f"sweep: nothing measured for tp={key.tp} seq={key.seq}: refused, every "
                     "layout is predicted not to fit (the change that would fit is printed "
                     "above; search.allow_predicted_oom=true measures it anyway)")
    missing = [k for k in missing if k not in refused]
    if refused and not missing:
        return lines
    for key in missing:
        counts, kept = merged(key)
        total_kept += kept
        for label, n in counts.items():
            total[label] = total.get(label, 0) + n
        if ranked:
            lines.append(f"sweep: nothing measured for tp={key.tp} seq={key.seq}: "
                         f"{by_class_text(counts) if counts else 'no trial ended ok'}")
    if not ranked:
        what = by_class_text(total) if total else "no trial ended ok"
        lines.append(f"sweep: nothing measured: {what}; errors in {trials_csv}")
    if total_kept:
        lines.append(f"sweep: {total_kept} failed or invalid trial(s) stored by an earlier "
                     "run are kept: after fixing the cause, search.retry=failed (or a class, e.g. "
                     f"search.retry={min(summary.kept_failures_total())}) measures them again")
    return lines


def print_two_stage(lines: list[dict[str, Any]], path: Any) -> None:
    """One line per key of a two-stage sweep: each stage's winner and whether they agree."""
    for ln in lines:
        verdict = {True: "the attention winner is Bridge's too", False: "they differ",
                   None: ln["note"]}[ln["matched"]]
        print(f"two-stage tp={ln['tp']} seq={ln['seq']}: attention best "
              f"{ln['attention_best'] or '-'}, Bridge best {ln['bridge_best'] or '-'} "
              f"(of {ln['bridge_candidates'] or 'none'}): {verdict}")
    print(f"two-stage: {path}")


def by_class_text(counts: dict[str, int]) -> str:
    """``{'oom': 2, 'invalid': 1}`` -> ``'3 trial(s) failed or were invalid (invalid: 1,
    oom: 2)'``."""
    classes = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return f"{sum(counts.values())} trial(s) failed or were invalid ({classes})"


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return format(v, spec)


def _known(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and v != v)


def _interval(r: dict[str, Any]) -> str:
    """The 95% interval in one unit, written once (``148-169 ms``), so that the cell fits."""
    lo, hi = r.get("ci_lo_s"), r.get("ci_hi_s")
    if not (_known(lo) and _known(hi)):
        return "-"
    scale, unit = (1e3, "ms") if hi < 1 else (1.0, "s")
    return f"{lo * scale:.3g}-{hi * scale:.3g} {unit}"


def print_recommendations(recs: list[dict[str, Any]], title: str) -> None:
    """The ranked keys: one table of TABLE_WIDTH columns per (cluster, model, env_tag),
    named on the line above it (a sweep has one); every column is in recommendations.csv."""
    from rich import box

    out = console()
    out.print(escape(title))
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["cluster"], r["model"], str(r["env_tag"]),
                           recommend.runner_label(r)), []).append(r)
    for (cluster, model, env_tag, label), rows in groups.items():
        out.print(escape(f"cluster={cluster} model={model} env_tag={env_tag}{label}"))
        table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        # runner=bridge keys: tokens/s per GPU at the key's m compares keys of other tp/pp/dp
        tokens = any(_known(r.get("tokens_per_gpu_s")) for r in rows)
        for col in ("tp", "cp", "seq", "best", "median", "95% CI", "n", "GiB", "runner-up",
                    "margin", "verdict", "vs p2p", "vs a2a", *(("tok/s/GPU",) if tokens else ()),
                    "trials"):
            table.add_column(escape(col), overflow="fold",
                             justify="left" if col in ("best", "runner-up", "verdict") else "right")
        for r in rows:
            mem = r.get("peak_mem_bytes")
            table.add_row(
                str(r["tp"]), str(r["cp"]), str(r["seq"]),
                escape(f"[{r['a2a']},{r['p2p']}] {r['comm_type']}"), human_time(r["median_s"]),
                _interval(r), str(r.get("n_trials") or "-"),
                _fmt(mem / 2**30 if mem and mem == mem else None, ".2f"),
                escape(str(r.get("runner_up") or "-")), _fmt(r.get("margin"), ".1%"),
                escape(str(r.get("verdict") or ("tie" if r.get("tie") else ""))),
                _fmt(r.get("speedup_vs_p2p"), ".2f"),
                _fmt(r.get("speedup_vs_a2a"), ".2f"),
                *((_fmt(r.get("tokens_per_gpu_s"), ".0f"),) if tokens else ()), str(r["trials"]),
            )
        out.print(table, width=TABLE_WIDTH)


def print_recommendation(rec: dict[str, Any], overrides: list[str], python: list[str],
                         results_dir: Optional[str] = None) -> None:
    out = console()
    out.print(escape(
        f"recommend: {rec['cluster']} {rec['model']} tp={rec['tp']} cp={rec['cp']} seq={rec['seq']} "
        + (f"packed mix={rec['mix']} " if isinstance(rec.get("mix"), str) and rec["mix"] else "")
        + f"env_tag={rec['env_tag']}{recommend.runner_label(rec)}: [{rec['a2a']},{rec['p2p']}] "
        f"{rec['comm_type']}, "
        f"{recommend.figure_text(rec)}"))
    for line in recommend.verdict_lines(rec, results_dir):
        out.print(escape(line))
    if rec.get("incomplete") and rec.get("missing"):
        out.print(escape(f"incomplete: not every layout has a valid measurement: "
                         f"{rec['missing']}; run the same sweep again to measure them"))
    out.print("\nBridge overrides:\n  " + escape(" ".join(overrides)))
    out.print("\nPython:\n  " + "\n  ".join(escape(p) for p in python))



def human_time(seconds: float) -> str:
    """A duration in the unit a person reads: ms below a second, s from there on."""
    if seconds == 0:
        return "0"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2f} ms"
