"""The memory timeline as a self-contained SVG: live bytes by category over the step.

A stacked step chart, one step per op node in execution order, with the
step's phases (forward, backward, optimizer) as a strip above it, a line for
the bytes in use while each op runs (its outputs next to the inputs it frees
after it, which is where peaks happen), the peak marked and labelled, and,
on an accelerator, the allocator's sampled figures as dots. Graphs with more
nodes than the plot has pixels are drawn one pixel column per group of
nodes, each column showing its fullest node, so the peak is never averaged
away. Every name in the picture is escaped: module and op names come from
user code.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from graphprof.analysis.memory import MemorySummary, TimelineColumns, memory_summary, timeline_columns
from graphprof.profile.model import Profile
from graphprof.render.escape import html_text

WIDTH, HEIGHT = 1000, 540
LEFT, RIGHT, TOP, BOTTOM = 84, 760, 88, 470  # plot area; the legend sits right of it
FONT = "font-family='Helvetica, Arial, sans-serif'"
CATEGORY_COLORS = {
    "parameters": "#4e79a7", "buffers": "#76b7b2", "optimizer_state": "#59a14f", "inputs": "#edc948",
    "gradients": "#e15759", "activations": "#f28e2b", "temporaries": "#b07aa1", "outputs": "#9c755f",
}
PHASE_COLORS = {"forward": "#c6dbef", "backward": "#fdd0a2", "optimizer": "#c7e9c0", "other": "#e0e0e0"}
_OTHER_COLOR = "#bab0ac"
_FREED_COLOR = "#d0d0d0"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: A plot coordinate from a node index (``x_of``) or a byte count (``y_of``).
Scale = Callable[[float], float]


def _nice_step(span: float, target_ticks: int, steps: Sequence[float] = (1, 2, 2.5, 5)) -> float:
    """A round tick interval that cuts ``span`` into about ``target_ticks`` pieces."""
    raw = max(span, 1e-12) / target_ticks
    exponent = math.floor(math.log10(raw))
    for m in (*steps, 10):
        if m * 10 ** exponent >= raw:
            return m * 10 ** exponent
    return 10 ** (exponent + 1)


def byte_ticks(max_bytes: float, target_ticks: int = 5) -> tuple[list[float], list[str], float]:
    """Tick values (bytes), their labels in one binary unit, and the axis top."""
    power = _unit_power(max_bytes)
    scale = 1024 ** power
    step = _nice_step(max_bytes / scale, target_ticks)
    top = math.ceil(max_bytes / scale / step - 1e-9) * step if max_bytes > 0 else step
    count = int(round(top / step))
    values = [i * step for i in range(count + 1)]
    labels = [f"{v:g} {_UNITS[power]}" if v else "0" for v in values]
    return [v * scale for v in values], labels, top * scale


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _buckets(n: int, columns: int) -> list[tuple[int, int]]:
    """Contiguous node ranges, one per drawn column (one node each when they fit)."""
    if n <= columns:
        return [(i, i + 1) for i in range(n)]
    return [(b * n // columns, (b + 1) * n // columns) for b in range(columns)]


def _text(x: float, y: float, content: str, size: int = 12, anchor: str = "start", extra: str = "") -> str:
    return (f"<text x='{_fmt(x)}' y='{_fmt(y)}' font-size='{size}' text-anchor='{anchor}' {FONT}{extra}>"
            f"{html_text(content)}</text>")


def _empty_svg(message: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT // 3}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT // 3}'><title>memory timeline</title>"
        f"<rect width='100%' height='100%' fill='white'/>"
        + _text(WIDTH / 2, HEIGHT / 6, message, 14, "middle") + "</svg>\n"
    )


def memory_timeline_svg(profile: Profile, graph_id: int = 0) -> str:
    """SVG text of graph ``graph_id``'s memory timeline (a short notice when there is no memory data)."""
    timeline = timeline_columns(profile, graph_id)
    if not timeline.node_ids:
        return _empty_svg(f"No memory records for graph {graph_id} in this profile.")
    return _render(timeline, memory_summary(profile, graph_id), profile.meta.function)


def _column_reps(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per bucket (``starts`` of contiguous ranges), the index of its first largest value:
    ``max(range(s, e), key=values.__getitem__)`` for every bucket at once."""
    n = len(values)
    largest = np.repeat(np.maximum.reduceat(values, starts), np.diff(np.append(starts, n)))
    return np.minimum.reduceat(np.where(values == largest, np.arange(n), n), starts)  # type: ignore[no-any-return]


def _render(t: TimelineColumns, summary: MemorySummary, function: str) -> str:
    n = len(t.node_ids)
    device_max = max((b for _, b in t.device_allocated), default=0)
    during_max = t.during_bytes.max()
    ticks, labels, y_top = byte_ticks(max(t.peak_bytes, during_max.item() if isinstance(during_max, np.generic)
                                          else during_max, device_max, 1))
    plot_w, plot_h = RIGHT - LEFT, BOTTOM - TOP
    buckets = _buckets(n, int(plot_w))
    col_w = plot_w / len(buckets)

    def x_of(node_index: float) -> float:
        return LEFT + plot_w * node_index / n

    def y_of(nbytes: float) -> float:
        return BOTTOM - plot_h * nbytes / y_top

    out: list[str] = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}'>",
        f"<title>{html_text('Memory timeline of ' + (function or 'the step') + ', graph ' + t.graph)}</title>",
        "<rect width='100%' height='100%' fill='white'/>",
        _text(LEFT, 26, f"Live memory over the step — {function or 'graph'} ({t.graph}, {n} op nodes)", 16,
              extra=" font-weight='bold'"),
    ]
    if summary.peak_node is not None:
        p = summary.peak_node
        where = ", ".join(s for s in (p.module, p.source) if s)
        out.append(_text(LEFT, 46, f"modelled peak {_bytes(t.peak_bytes)} while node {p.id} {p.name} "
                                   f"({p.op}) runs" + (f" — {where}" if where else ""), 12))
    out += _phase_strip(t, x_of)
    # grid and y axis
    for value, label in zip(ticks, labels):
        y = y_of(value)
        out.append(f"<line x1='{LEFT}' y1='{_fmt(y)}' x2='{RIGHT}' y2='{_fmt(y)}' stroke='#dddddd' stroke-width='1'/>")
        out.append(_text(LEFT - 8, y + 4, label, 12, "end"))
    out.append(_text(22, (TOP + BOTTOM) / 2, "live bytes", 13, "middle",
                     extra=f" transform='rotate(-90 22 {_fmt((TOP + BOTTOM) / 2)})'"))
    # stacked areas, one step per column
    # (the column values as Python ints, so y_of's arithmetic is Python's)
    starts = np.array([s for s, _ in buckets], dtype=np.intp)
    reps = _column_reps(t.live_bytes, starts)
    lower = [0] * len(reps)
    for c, category in enumerate(t.categories):
        upper = [lo + v for lo, v in zip(lower, t.live_by_category[c][reps].tolist())]
        out.append(_area(category, lower, upper, col_w, y_of))
        lower = upper
    # bytes in use while each op runs: the stack plus what the op frees when it ends
    during = np.maximum.reduceat(t.during_bytes, starts).tolist()
    out.append(_area("freed when the op ends", lower, during, col_w, y_of, _FREED_COLOR))
    points = _step_points(during, col_w, y_of)
    out.append(f"<polyline points='{' '.join(points)}' fill='none' stroke='#222222' stroke-width='1' "
               f"stroke-opacity='0.8'><title>in use while each op runs</title></polyline>")
    for index, value in t.device_allocated:
        out.append(f"<circle cx='{_fmt(x_of(index + 0.5))}' cy='{_fmt(y_of(value))}' r='2.5' fill='#000000'>"
                   f"<title>{html_text(f'allocator: {_bytes(value)} after node {t.node_ids[index]}')}</title></circle>")
    # axes
    out.append(f"<line x1='{LEFT}' y1='{BOTTOM}' x2='{RIGHT}' y2='{BOTTOM}' stroke='#333333'/>")
    out.append(f"<line x1='{LEFT}' y1='{TOP}' x2='{LEFT}' y2='{BOTTOM}' stroke='#333333'/>")
    step = max(1, int(_nice_step(n, 8, (1, 2, 5))))
    for i in range(0, n + 1, step):
        x = x_of(i)
        out.append(f"<line x1='{_fmt(x)}' y1='{BOTTOM}' x2='{_fmt(x)}' y2='{BOTTOM + 5}' stroke='#333333'/>")
        out.append(_text(x, BOTTOM + 19, str(i), 12, "middle"))
    out.append(_text((LEFT + RIGHT) / 2, BOTTOM + 42, "op nodes in execution order", 13, "middle"))
    out += _peak_marker(t, x_of, y_of)
    out += _legend(t, summary)
    out.append("</svg>\n")
    return "\n".join(out)


def _unit_power(value: float) -> int:
    power = 0
    while power < len(_UNITS) - 1 and abs(value) >= 1024 ** (power + 1):
        power += 1
    return power


def _bytes(value: float) -> str:
    """``7.11 MiB``, ``11.0 MiB``, ``535 KiB``, ``4 B``: three significant digits in a binary unit."""
    power = _unit_power(value)
    if power == 0:
        return f"{value:.0f} B"
    scaled = value / 1024 ** power
    decimals = max(0, 2 - math.floor(math.log10(scaled))) if scaled > 0 else 0
    return f"{scaled:.{decimals}f} {_UNITS[power]}"


def _step_points(values: Sequence[int], col_w: float, y_of: Scale) -> list[str]:
    """Left-to-right points of a step line, one level per column, equal neighbours merged."""
    points = [f"{_fmt(LEFT)},{_fmt(y_of(values[0]))}"]
    for b in range(1, len(values)):
        if values[b] != values[b - 1]:
            x = _fmt(LEFT + b * col_w)
            points += [f"{x},{_fmt(y_of(values[b - 1]))}", f"{x},{_fmt(y_of(values[b]))}"]
    points.append(f"{_fmt(LEFT + len(values) * col_w)},{_fmt(y_of(values[-1]))}")
    return points


def _area(category: str, lower: list[int], upper: list[int], col_w: float, y_of: Scale,
          color: str | None = None) -> str:
    top, bottom = _step_points(upper, col_w, y_of), _step_points(lower, col_w, y_of)
    color = color or CATEGORY_COLORS.get(category, _OTHER_COLOR)
    return (f"<path d='M{' L'.join(top + bottom[::-1])} Z' fill='{color}' stroke='none'>"
            f"<title>{html_text(category)}</title></path>")


def _phase_strip(t: TimelineColumns, x_of: Scale) -> list[str]:
    """Coloured runs of forward, backward and optimizer nodes above the plot."""
    out: list[str] = []
    y0, h = TOP - 26, 16
    phases = np.array(t.phases, dtype=object)
    ends = (np.flatnonzero(phases[1:] != phases[:-1]) + 1).tolist() + [len(t.phases)]
    start = 0
    for i in ends:  # each run of one phase is [start, i)
        phase = t.phases[start]
        x0, x1 = x_of(start), x_of(i)
        out.append(f"<rect x='{_fmt(x0)}' y='{y0}' width='{_fmt(max(x1 - x0, 0.5))}' height='{h}' "
                   f"fill='{PHASE_COLORS.get(phase, PHASE_COLORS['other'])}'><title>{html_text(phase)}: nodes "
                   f"{start}–{i - 1}</title></rect>")
        if x1 - x0 > 7 * len(phase) + 8:
            out.append(_text((x0 + x1) / 2, y0 + 12, phase, 11, "middle"))
        start = i
    return out


def _peak_marker(t: TimelineColumns, x_of: Scale, y_of: Scale) -> list[str]:
    x, y = x_of(t.peak_index + 0.5), y_of(t.peak_bytes)
    label = [f"peak {_bytes(t.peak_bytes)}", f"node {t.node_ids[t.peak_index]} {t.node_names[t.peak_index]}"]
    width = 7.0 * max(len(s) for s in label) + 12
    left_side = x + 10 + width > RIGHT
    bx = x - 10 - width if left_side else x + 10
    by = max(TOP + 2, min(y - 8, BOTTOM - 44))
    return [
        f"<line x1='{_fmt(x)}' y1='{BOTTOM}' x2='{_fmt(x)}' y2='{_fmt(y)}' stroke='#d62728' stroke-width='1.5' "
        f"stroke-dasharray='5,3'/>",
        f"<circle cx='{_fmt(x)}' cy='{_fmt(y)}' r='5' fill='#d62728' stroke='white' stroke-width='1.5'/>",
        f"<rect x='{_fmt(bx)}' y='{_fmt(by)}' width='{_fmt(width)}' height='38' rx='3' fill='white' "
        f"fill-opacity='0.92' stroke='#d62728'/>",
        _text(bx + 6, by + 15, label[0], 12, extra=" font-weight='bold' fill='#d62728'"),
        _text(bx + 6, by + 31, label[1], 11),
    ]


def _legend(t: TimelineColumns, summary: MemorySummary) -> list[str]:
    x, y = RIGHT + 24, TOP + 4
    at_peak = dict(summary.by_category_bytes)
    out = [_text(x, y, "at the peak", 12, extra=" font-weight='bold'")]
    y += 10
    for category in reversed(t.categories):  # top of the stack first, as drawn
        color = CATEGORY_COLORS.get(category, _OTHER_COLOR)
        out.append(f"<rect x='{x}' y='{y}' width='14' height='14' fill='{color}'/>")
        out.append(_text(x + 20, y + 12, category.replace("_", " "), 12))
        out.append(_text(WIDTH - 12, y + 12, _bytes(at_peak.get(category, 0)), 12, "end"))
        y += 22
    y += 6
    out.append(f"<rect x='{x}' y='{y}' width='14' height='14' fill='{_FREED_COLOR}'/>")
    out.append(_text(x + 20, y + 12, "freed when the op ends", 12))
    y += 22
    out.append(f"<line x1='{x}' y1='{y + 7}' x2='{x + 14}' y2='{y + 7}' stroke='#222222'/>")
    out.append(_text(x + 20, y + 12, "in use while an op runs", 12))
    y += 22
    out.append(f"<line x1='{x + 7}' y1='{y}' x2='{x + 7}' y2='{y + 14}' stroke='#d62728' stroke-dasharray='4,2'/>")
    out.append(_text(x + 20, y + 12, "peak", 12))
    if t.device_allocated:
        y += 22
        out.append(f"<circle cx='{x + 7}' cy='{y + 7}' r='3' fill='#000000'/>")
        out.append(_text(x + 20, y + 12, "allocator (measured)", 12))
    y += 34
    for phase in ("forward", "backward", "optimizer"):
        if phase in t.phases:
            out.append(f"<rect x='{x}' y='{y}' width='14' height='10' fill='{PHASE_COLORS[phase]}'/>")
            out.append(_text(x + 20, y + 10, f"{phase} nodes", 11))
            y += 18
    return out
