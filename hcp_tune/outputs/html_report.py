"""Self-contained HTML pages: the ``regress`` comparison and the ``report`` of a sweep.

One file each, inline CSS and inline SVG (``hcp_tune/outputs/svg.py``): no script, no font, no
image, nothing fetched, so the page opens from disk on a machine without a network.
Plots per key:

- regress: each layout's judged step-time ratio (its deviation from the night's common
  shift, or its whole change when no shift is separated) with its interval, the no-change
  line and the threshold band; and every per-trial median of each layout under both tags.
- report: step time against peak memory of each layout with the Pareto front drawn; the
  spread of each layout's measured steps (every step of every ok trial, median ticked);
  predicted against measured step time where the cost model has a prediction.
"""
from __future__ import annotations

import datetime
from typing import Optional

from hcp_tune.outputs import svg
from hcp_tune.outputs.regress import Comparison
from hcp_tune.outputs.regress.view import (
    HEADERS,
    cells,
    next_steps,
    shared_levels,
    shift_advice,
    shift_lines,
    spread_line,
    summary_line,
    winner_lines,
)
from hcp_tune.outputs.report import KeySummary

CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: left; }
tr.flagged td { background: #fde8e8; font-weight: bold; }
tr.inconclusive td { background: #fff6d6; }
.warn { background: #fff6d6; border: 1px solid #e6c200; padding: 6px 10px; margin: 6px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.note { color: #555; font-size: 12px; }
"""


def page(title: str, body: list[str]) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{svg.esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{svg.esc(title)}</h1>", f'<p class="note">written {stamp} by hcp-tune</p>',
        *body, "</body></html>", ""])


def _table(headers, rows, classes=None) -> str:
    """``classes``: per row a CSS class ("flagged", "inconclusive") or "" for none."""
    out = ["<table><tr>" + "".join(f"<th>{svg.esc(h)}</th>" for h in headers) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{svg.esc(c)}</td>" for c in row) + "</tr>")
    return "\n".join(out + ["</table>"])


def _warnings(lines: list[str]) -> list[str]:
    return [f'<div class="warn">{svg.esc(w)}</div>' for w in lines]


def regress_page(report: Comparison) -> str:
    o = report.options
    body = [f"<p><b>{svg.esc(summary_line(report))}</b></p>"]
    body += _warnings(shift_lines(report) + shared_levels(report) + [spread_line(report)]
                      + shift_advice(report) + winner_lines(report) + next_steps(report)
                      + report.warnings)
    body.append(_table(HEADERS, [cells(c) for c in report.comparisons],
                       ["flagged" if c.flagged else "inconclusive" if c.inconclusive else ""
                        for c in report.comparisons]))
    body.append(f'<p class="note">method: {svg.esc(report.method)}.</p>')
    for k in report.keys:
        body.append(f"<h2>{svg.esc(k.name)}</h2>")
        body.append(f"<p>winner: {svg.esc(k.base_winner)} ({svg.esc(o.baseline)}) &rarr; "
                    f"{svg.esc(k.cand_winner)} ({svg.esc(o.candidate)})"
                    + (" <b>changed</b>" if k.winner_changed else "") + "</p>")
        if not k.layouts:
            body.append("<p>no layout measured under both tags</p>")
            continue
        rows = [f"{c.layout} {c.comm_type}" for c in k.layouts]
        ratio = svg.RowsChart(
            "ratio", rows, f"judged step time ratio {o.candidate} / {o.baseline} "
            f"({o.ci * 100:g}% interval; green: +/- the threshold)", ["ratio"],
            vlines=[(1.0, "no change")],
            bands=[(i, 1 - o.threshold, 1 + o.threshold) for i, _ in enumerate(k.layouts)])
        for i, c in enumerate(k.layouts):
            if c.est is not None:
                lo, hi = c.ci
                ratio.marks.append(svg.Mark(
                    i, c.est.ratio(), 0, lo, hi,
                    title=f"{c.layout}: ratio {c.est.ratio():.3f} [{lo:.3f}, {hi:.3f}], "
                          f"{c.verdict}"))
        times = svg.RowsChart("step-times", rows, "per-trial median step time (s)",
                              [f"{o.baseline} (baseline)", f"{o.candidate} (candidate)"])
        for i, c in enumerate(k.layouts):
            for s, values in ((0, c.base_s), (1, c.cand_s)):
                times.marks += [svg.Mark(i, v, s, title=f"{c.layout} {v:.4g} s") for v in values]
        body.append('<div class="plots">' + svg.rows_chart(ratio) + svg.rows_chart(times)
                    + "</div>")
    return page(f"hcp-tune regress: {o.baseline} vs {o.candidate}", body)


def _gib(v: Optional[float]) -> str:
    return "-" if v is None else f"{v / 2**30:.4g}"


def report_page(keys: list[KeySummary], title: str) -> str:
    body = [f"<p>{len(keys)} sweep key(s). Pareto front: layouts no other layout beats on "
            "both step time and peak memory (red line, <b>yes</b> in the table).</p>"]
    for k in keys:
        body.append(f"<h2>{svg.esc(k.name)}</h2>")
        if k.key.get("runner") == "synthetic":
            body += _warnings(["runner=synthetic: these trials were drawn from a truth file "
                               "(a what-if or a benchmark), not measured"])
        if k.injected:
            body += _warnings([f"{k.injected} trial(s) of this key ran with an injected delay "
                               "(HCP_TUNE_INJECT_DELAY): a testing aid, not a real measurement"])
        if k.not_ok:
            body.append('<p class="note">not ranked: ' + ", ".join(
                f"{n} {s}" for s, n in sorted(k.not_ok.items())) + "</p>")
        if not k.layouts:
            body.append("<p>no layout ended ok</p>")
            continue
        if k.verdict:
            body.append(f"<p><b>{svg.esc(k.verdict)}</b> (docs: ranking and verdicts)</p>")
        body.append(_table(
            ("layout", "trials", "median step s", "95% CI s", "peak mem GiB", "Pareto",
             "predicted s"),
            [(f"{s.label} {s.comm_type}", s.trials, f"{s.median_s:.4g}",
              f"{s.ci_lo_s:.4g}-{s.ci_hi_s:.4g}" if s.ci_lo_s is not None else "-",
              _gib(s.peak_mem_bytes),
              "yes" if s.pareto else "", f"{s.predicted_s:.4g}" if s.predicted_s else "-")
             for s in k.layouts]))
        front = sorted((s for s in k.layouts if s.pareto), key=lambda s: s.median_s)
        mem = lambda s: (s.peak_mem_bytes or 0) / 2**30  # noqa: E731
        # a CPU trial's peak is RSS growth, often 0: an axis of zeros is no chart
        memory = any(s.peak_mem_bytes for s in k.layouts)
        scatter = svg.XYChart(
            "pareto", "median step time (s)", "peak memory (GiB)",
            [svg.Point(s.median_s, mem(s), s.label, 1 if s.pareto else 0,
                       f"{s.label}: {s.median_s:.4g} s, "
                       + (f"{mem(s):.4g} GiB" if s.peak_mem_bytes is not None
                          else "memory not measured (drawn at 0)")
                       + (" (Pareto)" if s.pareto else "")) for s in k.layouts],
            series=["layout", "on the Pareto front"],
            line=[(s.median_s, mem(s)) for s in front], line_label="Pareto front")
        spread = svg.RowsChart("spread", [f"{s.label} {s.comm_type}" for s in k.layouts],
                               "measured step time (s), every step of every ok trial",
                               ["step", "median"])
        for i, s in enumerate(k.layouts):
            spread.marks += [svg.Mark(i, t, 0) for t in s.steps_s]
            spread.marks.append(svg.Mark(i, s.median_s, 1, shape="tick",
                                         title=f"{s.label} median {s.median_s:.4g} s"))
        plots = [svg.xy_chart(scatter)] if memory else []
        plots.append(svg.rows_chart(spread))
        predicted = [s for s in k.layouts if s.predicted_s]
        if predicted:
            plots.append(svg.xy_chart(svg.XYChart(
                "predicted", "measured median step (s)", "predicted step (s)",
                [svg.Point(s.median_s, s.predicted_s, s.label) for s in predicted],
                diagonal=True)))
        body.append('<div class="plots">' + "".join(plots) + "</div>")
        if not memory:
            body.append('<p class="note">no time-memory chart: no trial of this key measured '
                        "a peak memory above 0 (a CPU trial records its RSS growth, often 0)</p>")
        if predicted:
            body.append(f'<p class="note">prediction: {svg.esc(k.prediction_label)}</p>')
    return page(title, body)
