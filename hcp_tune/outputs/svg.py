"""Inline SVG plots for the HTML reports: no JavaScript, no network, no plotting library.

Two chart shapes cover every plot the reports draw:

- ``rows_chart``: one row per category (a layout), a linear x axis; each row holds marks
  (points, intervals, short ticks) in series colours; optional vertical reference lines
  and a shaded band. Used for ratios with their intervals and for step-time spreads.
- ``xy_chart``: a scatter over two linear axes, optional polyline (the Pareto front) and a
  diagonal (predicted = measured).

Every chart is an ``<svg class="plot" data-plot=KIND>`` element whose marks carry
``class="mark"``, so a browser test can count what was drawn.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
FONT = 'font-family="sans-serif" font-size="11"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def nice_range(values: Sequence[float], *, include: Sequence[float] = (), pad: float = 0.06
               ) -> tuple[float, float]:
    vals = [v for v in (*values, *include) if v is not None and math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if hi == lo:
        lo, hi = lo - abs(lo) * 0.1 - 1e-9, hi + abs(hi) * 0.1 + 1e-9
    span = hi - lo
    return lo - span * pad, hi + span * pad


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


@dataclass
class Mark:
    row: int
    x: float
    series: int = 0
    lo: Optional[float] = None  # an interval from lo to hi around x
    hi: Optional[float] = None
    title: str = ""
    shape: str = "dot"  # dot | tick


@dataclass
class RowsChart:
    kind: str
    rows: list[str]
    x_label: str
    series: list[str]
    marks: list[Mark] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label)
    bands: list[tuple[int, float, float]] = field(default_factory=list)  # (row, lo, hi)
    width: int = 640
    row_h: int = 26


def rows_chart(chart: RowsChart) -> str:
    left, right, top, bottom = 130, 20, 24, 44
    w = chart.width
    h = top + bottom + chart.row_h * max(1, len(chart.rows))
    xs = [m.x for m in chart.marks] + [v for m in chart.marks for v in (m.lo, m.hi) if v]
    lo, hi = nice_range(xs, include=[x for x, _ in chart.vlines])
    sx = lambda x: left + (x - lo) / (hi - lo) * (w - left - right)  # noqa: E731
    n_series = max(1, len(chart.series))
    sy = lambda row, s: top + chart.row_h * (row + (s + 1) / (n_series + 1))  # noqa: E731
    out = [f'<svg class="plot" data-plot="{esc(chart.kind)}" xmlns="http://www.w3.org/2000/svg" '
           f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">',
           f'<rect x="{left}" y="{top}" width="{w - left - right}" '
           f'height="{h - top - bottom}" fill="#fafafa" stroke="#ccc"/>']
    for row, b0, b1 in chart.bands:
        b0, b1 = max(lo, b0), min(hi, b1)
        out.append(f'<rect class="band" x="{sx(b0):.1f}" y="{top + chart.row_h * row + 2}" '
                   f'width="{max(0, sx(b1) - sx(b0)):.1f}" height="{chart.row_h - 4}" '
                   'fill="#dcebdc"><title>not flagged inside this band</title></rect>')
    for t in ticks(lo, hi):
        out.append(f'<line x1="{sx(t):.1f}" y1="{h - bottom}" x2="{sx(t):.1f}" '
                   f'y2="{h - bottom + 4}" stroke="#555"/><text x="{sx(t):.1f}" '
                   f'y="{h - bottom + 16}" text-anchor="middle" {FONT}>{t:.4g}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 8}" text-anchor="middle" {FONT}>'
               f'{esc(chart.x_label)}</text>')
    for x, label in chart.vlines:
        out.append(f'<line x1="{sx(x):.1f}" y1="{top}" x2="{sx(x):.1f}" y2="{h - bottom}" '
                   f'stroke="#888" stroke-dasharray="4 3"/><text x="{sx(x):.1f}" y="{top - 6}" '
                   f'text-anchor="middle" {FONT}>{esc(label)}</text>')
    for i, name in enumerate(chart.rows):
        out.append(f'<text x="{left - 8}" y="{top + chart.row_h * (i + 0.5) + 4:.1f}" '
                   f'text-anchor="end" {FONT}>{esc(name)}</text>')
    for m in chart.marks:
        # a tick marks a value on the line of series 0's points (a median among its steps)
        y, col = sy(m.row, 0 if m.shape == "tick" else m.series), COLOURS[m.series % len(COLOURS)]
        tip = f"<title>{esc(m.title)}</title>" if m.title else ""
        if m.lo is not None and m.hi is not None:
            out.append(f'<line class="interval" x1="{sx(m.lo):.1f}" y1="{y:.1f}" '
                       f'x2="{sx(m.hi):.1f}" y2="{y:.1f}" stroke="{col}" stroke-width="2"/>')
        if m.shape == "tick":
            out.append(f'<line class="mark" x1="{sx(m.x):.1f}" y1="{y - 7:.1f}" x2="{sx(m.x):.1f}" '
                       f'y2="{y + 7:.1f}" stroke="{col}" stroke-width="2">{tip}</line>')
        else:
            out.append(f'<circle class="mark" cx="{sx(m.x):.1f}" cy="{y:.1f}" r="4" '
                       f'fill="{col}" fill-opacity="0.75">{tip}</circle>')
    if len(chart.series) > 1:  # one series needs no legend (its name is the axis label)
        out += _legend(chart.series, left, 14)
    out.append("</svg>")
    return "\n".join(out)


def _legend(series: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(series):
        if not name:
            continue
        col = COLOURS[i % len(COLOURS)]
        out.append(f'<circle cx="{x + 6 + i * 150}" cy="{y - 4}" r="4" fill="{col}"/>'
                   f'<text x="{x + 14 + i * 150}" y="{y}" {FONT}>{esc(name)}</text>')
    return out


@dataclass
class Point:
    x: float
    y: float
    label: str = ""
    series: int = 0
    title: str = ""


@dataclass
class XYChart:
    kind: str
    x_label: str
    y_label: str
    points: list[Point]
    series: list[str] = field(default_factory=list)
    line: list[tuple[float, float]] = field(default_factory=list)  # e.g. the Pareto front
    line_label: str = ""
    diagonal: bool = False  # draw y = x
    width: int = 460
    height: int = 320


def xy_chart(chart: XYChart) -> str:
    left, right, top, bottom = 70, 20, 26, 44
    w, h = chart.width, chart.height
    xs, ys = [p.x for p in chart.points], [p.y for p in chart.points]
    if chart.diagonal:
        both = nice_range(xs + ys)
        (x0, x1), (y0, y1) = both, both
    else:
        (x0, x1), (y0, y1) = nice_range(xs), nice_range(ys)
    sx = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
    sy = lambda y: h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom)  # noqa: E731
    out = [f'<svg class="plot" data-plot="{esc(chart.kind)}" xmlns="http://www.w3.org/2000/svg" '
           f'width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">',
           f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" '
           'fill="#fafafa" stroke="#ccc"/>']
    for t in ticks(x0, x1, 4):
        out.append(f'<text x="{sx(t):.1f}" y="{h - bottom + 16}" text-anchor="middle" {FONT}>'
                   f'{t:.3g}</text>')
    for t in ticks(y0, y1, 4):
        out.append(f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" {FONT}>'
                   f'{t:.3g}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 8}" text-anchor="middle" {FONT}>'
               f'{esc(chart.x_label)}</text>')
    out.append(f'<text x="14" y="{(top + h - bottom) / 2}" text-anchor="middle" {FONT} '
               f'transform="rotate(-90 14 {(top + h - bottom) / 2})">{esc(chart.y_label)}</text>')
    if chart.diagonal:
        out.append(f'<line x1="{sx(x0):.1f}" y1="{sy(x0):.1f}" x2="{sx(x1):.1f}" y2="{sy(x1):.1f}" '
                   'stroke="#888" stroke-dasharray="4 3"><title>predicted = measured</title></line>')
    if len(chart.line) > 1:
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in chart.line)
        out.append(f'<polyline class="front" points="{pts}" fill="none" stroke="#d62728" '
                   f'stroke-width="2"><title>{esc(chart.line_label)}</title></polyline>')
    for p in chart.points:
        col = COLOURS[p.series % len(COLOURS)]
        out.append(f'<circle class="mark" cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="5" '
                   f'fill="{col}"><title>{esc(p.title or p.label)}</title></circle>')
        if p.label:
            out.append(f'<text x="{sx(p.x) + 7:.1f}" y="{sy(p.y) - 6:.1f}" {FONT}>'
                       f'{esc(p.label)}</text>')
    out += _legend(chart.series, left, 16)
    out.append("</svg>")
    return "\n".join(out)
