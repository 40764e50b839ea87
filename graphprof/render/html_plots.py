"""Inline SVG plots for the HTML report, drawn in Python.

Drawing on the server side keeps the report viewable with scripts off and
without any charting library (the file must be self-contained): the page's
only script sorts tables.

The roofline scatter puts every node that has FLOPs, bytes and time at
(arithmetic intensity = FLOPs / bytes moved, achieved FLOP/s), on log-log
axes, coloured by phase and sized by share of time. When ``profile.meta.peaks``
holds ``flops_per_s`` (compute roof; other ``flops_per_s*`` keys, e.g. per
dtype, are drawn too) and ``bytes_per_s`` (bandwidth roof), the roofs are
drawn: a node far under them is neither compute- nor memory-bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from graphprof.render.escape import html_text
from graphprof.render.units import format_count, format_number, format_time

PHASE_POINT_COLOURS = {"forward": "#3b75af", "backward": "#e1812c", "optimizer": "#3a923a", "other": "#7f7f7f"}
MAX_POINTS = 5000


@dataclass(frozen=True)
class RooflinePoint:
    """One node on the roofline plot."""

    label: str
    phase: str
    intensity: float
    flop_per_s: float
    time_s: float
    share: float


def _log_range(values: Sequence[float]) -> tuple[float, float]:
    """Whole decades around ``values``, with room so no point sits on the frame."""
    low, high = math.log10(min(values)), math.log10(max(values))
    lo, hi = math.floor(low), math.ceil(high)
    if low - lo < 0.25:
        lo -= 1
    if hi - high < 0.25:
        hi += 1
    return lo, hi


def compute_roof_labels(peaks: Mapping[str, float]) -> dict[str, float]:
    """Compute roofs to draw, labelled: ``flops_per_s`` is "compute roof", ``flops_per_s_bfloat16``
    "bfloat16 roof"; a roof equal to a more specific one (the default dtype's) is drawn once."""
    roofs: dict[float, str] = {}
    for key, value in sorted(peaks.items(), key=lambda kv: kv[0] == "flops_per_s"):  # specific keys first
        if not key.startswith("flops_per_s") or not value or value <= 0:
            continue
        suffix = key[len("flops_per_s"):].strip("_.:")
        roofs.setdefault(float(value), f"{suffix} roof" if suffix else "compute roof")
    return {label: value for value, label in roofs.items()}


def _decade(e: int) -> str:
    """Tick label of 10**e: ``0.001`` ... ``10000``, exponents beyond."""
    return f"{10.0 ** e:g}" if -3 <= e <= 4 else f"1e{e}"


def roofline_svg(points: Sequence[RooflinePoint], peaks: Mapping[str, float], width: int = 900,
                 height: int = 460) -> str:
    """The roofline scatter as an ``<svg>`` element (a short note when nothing can be plotted)."""
    if not points:
        return ('<p class="note">No node has FLOPs, bytes moved and a measured time together, so there is '
                "nothing to place on a roofline (FLOPs and bytes come from graphprof's cost pass).</p>")
    points = sorted(points, key=lambda p: p.time_s, reverse=True)[:MAX_POINTS]
    compute_roofs = compute_roof_labels(peaks)
    bandwidth = peaks.get("bytes_per_s") if peaks.get("bytes_per_s", 0) and peaks["bytes_per_s"] > 0 else None
    xs = [p.intensity for p in points]
    ys = [p.flop_per_s for p in points] + list(compute_roofs.values())
    x_lo, x_hi = _log_range(xs)
    y_lo, y_hi = _log_range(ys)
    left, right, top, bottom = 100, 120, 16, 48
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (math.log10(x) - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return top + ph - (math.log10(y) - y_lo) / (y_hi - y_lo) * ph

    out = [f'<svg class="plot" role="img" aria-label="roofline" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fcfcfc" stroke="#999"/>',
           f'<clipPath id="roof-clip"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath>']
    for e in range(int(x_lo), int(x_hi) + 1):
        x = sx(10.0 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#e4e4e4"/>'
                   f'<text x="{x:.1f}" y="{top + ph + 16}" class="tick" text-anchor="middle">{html_text(_decade(e))}</text>')
    for e in range(int(y_lo), int(y_hi) + 1):
        y = sy(10.0 ** e)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{html_text(format_count(10.0 ** e, "FLOP/s"))}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" class="axis" text-anchor="middle">'
               "arithmetic intensity (FLOP per byte moved)</text>")
    out.append(f'<text x="16" y="{top + ph / 2}" class="axis" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2})">achieved FLOP/s</text>')
    out.append('<g clip-path="url(#roof-clip)">')
    x_min, x_max = 10.0 ** x_lo, 10.0 ** x_hi
    for name, roof in compute_roofs.items():
        if bandwidth:
            knee = roof / bandwidth
            out.append(f'<polyline class="roof" points="{sx(x_min):.1f},{sy(max(bandwidth * x_min, 1e-300)):.1f} '
                       f'{sx(knee):.1f},{sy(roof):.1f} {sx(x_max):.1f},{sy(roof):.1f}"/>')
        else:
            out.append(f'<line class="roof" x1="{left}" y1="{sy(roof):.1f}" x2="{left + pw}" y2="{sy(roof):.1f}"/>')
        out.append(f'<text x="{left + pw - 4}" y="{sy(roof) - 5:.1f}" class="roof-label" text-anchor="end">'
                   f"{html_text(name)} {html_text(format_count(roof, 'FLOP/s'))}</text>")
    if bandwidth and not compute_roofs:
        out.append(f'<line class="roof" x1="{sx(x_min):.1f}" y1="{sy(bandwidth * x_min):.1f}" '
                   f'x2="{sx(x_max):.1f}" y2="{sy(bandwidth * x_max):.1f}"/>')
    out.append("</g>")
    if bandwidth:
        out.append(f'<text x="{left + 6}" y="{top + 14}" class="roof-label">bandwidth roof '
                   f"{html_text(format_count(bandwidth, 'B/s'))}</text>")
    # One circle per point, up to MAX_POINTS: sx and sy written out (the same arithmetic), and only the
    # label escaped (the figures hold nothing to escape; the newlines are "&#10;").
    log10, sqrt, colours = math.log10, math.sqrt, PHASE_POINT_COLOURS
    x_span, y_span = x_hi - x_lo, y_hi - y_lo
    out += [f'<circle class="pt" cx="{left + (log10(p.intensity) - x_lo) / x_span * pw:.1f}" '
            f'cy="{top + ph - (log10(p.flop_per_s) - y_lo) / y_span * ph:.1f}" '
            f'r="{2.5 + 9.0 * sqrt(max(p.share, 0.0)):.1f}" fill="{colours.get(p.phase, "#7f7f7f")}"><title>'
            f"{html_text(p.label)}&#10;{format_time(p.time_s)} ({100 * p.share:.2g}% of step)&#10;"
            f"{format_count(p.flop_per_s, 'FLOP/s')}, {format_number(p.intensity)} FLOP/B</title></circle>"
            for p in reversed(points)]  # largest drawn last, on top
    lx = left + pw + 18  # legend to the right of the frame, never over a point
    for i, (phase, colour) in enumerate(PHASE_POINT_COLOURS.items()):
        out.append(f'<circle cx="{lx}" cy="{top + 10 + i * 20}" r="5" fill="{colour}"/>'
                   f'<text x="{lx + 10}" y="{top + 14 + i * 20}" class="tick">{phase}</text>')
    out.append(f'<text x="{lx - 5}" y="{top + 100}" class="tick">size: share</text>'
               f'<text x="{lx - 5}" y="{top + 114}" class="tick">of step time</text>')
    out.append("</svg>")
    return "".join(out)


def bar_rows(rows: Sequence[tuple[str, str, float, float, int]], detail_header: str | None = "type") -> str:
    """A sortable table of labelled horizontal bars: (label, detail, time_s, share, ops) per row.

    ``detail_header`` names the second column; None leaves it out.
    """
    body = []
    for label, detail, time_s, share, ops in rows:
        width = max(0.0, min(100.0, 100.0 * share))
        detail_cell = "" if detail_header is None else f'<td class="name">{html_text(detail)}</td>'
        body.append(
            f'<tr><td class="name" title="{html_text(label)}">{html_text(label)}</td>{detail_cell}'
            f'<td class="num" data-v="{ops}">{ops}</td><td class="num" data-v="{time_s:.9g}">{html_text(format_time(time_s))}</td>'
            f'<td class="num" data-v="{share:.9g}">{100 * share:.1f}</td>'
            f'<td class="bar"><div style="width:{width:.2f}%"></div></td></tr>')
    detail_th = "" if detail_header is None else f"<th>{html_text(detail_header)}</th>"
    return ('<table class="sortable bars"><thead><tr><th>name</th>' + detail_th + '<th class="num">ops</th>'
            '<th class="num">time</th><th class="num">%</th><th>share</th></tr></thead><tbody>'
            + "".join(body) + "</tbody></table>")
