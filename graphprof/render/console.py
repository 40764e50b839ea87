"""Console rendering of a profile table (``graphprof analyze``, ``Profile.table``).

Any tabulate table format works (``simple`` by default, ``github`` for
Markdown, ``fancy_grid`` for MegEngine's look); ``csv`` and ``json`` give raw
SI numbers through ``graphprof.render.tabular``. Human units (ns..s,
FLOP..PFLOP, B..GiB) appear only here.

Tables fit the width: ``options.width``, else ``COLUMNS`` or the terminal,
else 120 characters (``terminal_width``). Columns go by priority (the rank,
time, share and name always stay), then names, modules, paths and shapes are
clipped in the middle, the way torch.profiler's table clips its name column.
``--wide`` prints every default column unclipped; ``--columns`` picks them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from graphprof.analysis.node_time import clock_label
from graphprof.analysis.columns import BY_KEY, resolve_columns
from graphprof.analysis.options import DATA_FORMATS, TableOptionError, TableOptions
from graphprof.analysis.table import Row, TableResult
from graphprof.render.escape import terminal_line
from graphprof.render.fit import (
    SIMPLE, FitColumn, fit_widths, format_overhead, header_padding, terminal_width, text_table,
)
from graphprof.render.units import (
    clip_middle, format_bytes, format_count, format_shapes, format_time, format_value, plural,
)

#: Widest a text column prints by default (``--wide``: no limit), and the least it is clipped to.
_WIDTH = {"name": 32, "module": 28, "module_type": 16, "source": 30, "scope": 24, "in_shapes": 36, "out_shapes": 24,
          "label": 30, "type": 28, "graph": 16, "phase": 9, "op": 32}
#: The least a text column is clipped to before a less important column is dropped instead:
#: what names the row keeps enough to be recognised.
_MIN_WIDTH = {"name": 22, "label": 22, "type": 18, "module": 16, "source": 16, "in_shapes": 16}
_MIN_OTHER = 10
#: Formats read as markup or data, not in a terminal: printed like --wide.
_UNFITTED = {"html", "unsafehtml", "latex", "latex_raw", "latex_booktabs", "latex_longtable", "mediawiki",
             "moinmoin", "textile", "asciidoc", "jira", "tsv", "youtrack"}
_METRICS = ("flops", "flop_per_s", "bytes_moved", "bandwidth_bytes_per_s", "intensity_flop_per_byte")
_MEMORY = ("allocated_bytes", "freed_bytes", "live_bytes")
#: Descriptive columns of an aggregated table, by --aggregate-by (None: one row "all").
_GROUP_COLUMNS: dict[str | None, tuple[str, ...]] = {
    None: ("label",), "type": ("type",), "module": ("module", "module_type"), "source": ("source",),
    "shape": ("type", "in_shapes"), "scope": ("scope",), "phase": ("phase",), "graph": ("graph",),
}
_NODE_COLUMNS = ("id", "name", "type", "module", "source")
#: Which columns stay when the terminal is narrow: lower numbers stay longer. The rank, time,
#: share and the row's name (node, or group) always stay; the rest go from the highest number.
_PRIORITY = {
    "time_s": 0, "percent": 0, "name": 1, "type": 2, "cumulative_percent": 3, "calls": 3, "module": 4,
    "flops": 5, "flop_per_s": 6, "bytes_moved": 7, "bandwidth_bytes_per_s": 8, "source": 9,
    "in_shapes": 10, "live_bytes": 11, "allocated_bytes": 12, "id": 13, "graph": 13,
    "intensity_flop_per_byte": 14, "freed_bytes": 15, "module_type": 16, "out_shapes": 17,
}
_CORE = 4  # priorities up to here are clipped before they are dropped


def table_formats() -> list[str]:
    """Every --format value: tabulate's table formats plus csv and json."""
    from tabulate import tabulate_formats

    return sorted(set(tabulate_formats) | set(DATA_FORMATS))


def check_format(fmt: str) -> None:
    """Raise TableOptionError unless ``fmt`` is a known output format.

    ``simple`` (the default) and the data formats are known without importing tabulate (``text_table``).
    """
    if fmt != SIMPLE and fmt not in DATA_FORMATS and fmt not in table_formats():
        raise TableOptionError(f"--format {fmt!r} is unknown; choose csv, json or a tabulate format such as simple, github, grid")


@dataclass(frozen=True)
class _Column:
    """A printed column: header, cell text at a width (None: natural), and how it may shrink."""

    key: str
    header: str
    cell: Callable[[Row, "int | None"], str]
    priority: int
    clippable: bool = False


def _text_cell(key: str) -> Callable[[Row, "int | None"], str]:
    def cell(row: Row, width: int | None) -> str:
        value: Any = row.label if key == "label" else getattr(row, key)
        if key in ("in_shapes", "out_shapes"):
            return format_shapes(value, limit=None, width=width)
        if value is None:
            text = "*" if key != "id" else "-"  # a group whose nodes differ
        else:
            text = terminal_line(value) or "-"  # a name's newline or escape sequence shows as \n, \x1b
        return clip_middle(text, width) if width is not None else text
    return cell


def _metric_cell(key: str) -> Callable[[Row, "int | None"], str]:
    unit = BY_KEY[key].unit
    if key == "percent":
        return lambda r, w: f"{r.percent:.1f}"
    if key == "cumulative_percent":
        return lambda r, w: f"{r.cumulative_percent:.1f}"
    return lambda r, w: format_value(getattr(r, key), unit)


def _column(key: str, result: TableResult) -> _Column:
    options = result.options
    if key == "label":
        return _Column(key, "group", _text_cell(key), 1, clippable=True)
    column = BY_KEY[key]
    header = column.title
    if key == "time_s" and options.aggregated and options.aggregate_fn != "sum":
        header = f"self time ({options.aggregate_fn})"
    text = column.kind != "number"
    return _Column(key, header, _text_cell(key) if text else _metric_cell(key), _PRIORITY.get(key, 18),
                   clippable=text)


def _default_keys(result: TableResult) -> list[str]:
    options = result.options
    keys: list[str] = []
    if options.aggregated:
        keys += [*_GROUP_COLUMNS[options.aggregate_by], "calls"]
    keys += ["time_s", "percent", "cumulative_percent"]
    if not options.aggregated:
        keys += _NODE_COLUMNS if result.summary.graphs < 2 else ("graph", *_NODE_COLUMNS)  # ids are per graph
    keys += _METRICS
    if result.has_memory:
        keys += _MEMORY
    if not options.aggregated:
        keys += ["in_shapes", "out_shapes"]
    return keys


def _essential(result: TableResult) -> set[str]:
    """Columns never dropped to fit: time, share, what names the row, and the order's column."""
    order = result.order.column.key
    if result.options.aggregated:
        return {"time_s", "percent", order, *(k for k in _GROUP_COLUMNS[result.options.aggregate_by] if k != "module_type")}
    return {"time_s", "percent", "name", order}


def _fit(cols: list[_Column], natural: dict[str, int], least: dict[str, int], keep: set[str],
         fmt: str, width: int) -> tuple[list[_Column], dict[str, int]]:
    """Fit ``width``: drop minor columns, then clip text columns, then drop core ones too.

    Names stay whole as long as only minor columns (rates, bytes, shapes,
    ids) pay for it; a core column (``_CORE``) goes only when clipping every
    text column to its least width is not enough.
    """
    fit = [FitColumn("#", natural["#"], natural["#"], -1, keep=True)]
    fit += [FitColumn(c.key, natural[c.key], least[c.key], c.priority, keep=c.key in keep) for c in cols]
    widths = fit_widths(fit, fmt, width, _CORE)
    return [c for c in cols if c.key in widths], widths


def _fitted(options: TableOptions) -> bool:
    return not options.wide and options.format not in _UNFITTED


def _layout(result: TableResult) -> tuple[list[_Column], dict[str, int | None]]:
    """The columns to print and each one's cell width (None: as long as it is)."""
    options = result.options
    explicit = bool(options.columns)
    keys = list(resolve_columns(options.columns)) if explicit else _default_keys(result)
    order = result.order.column.key
    if not explicit and order not in keys:  # ordered by a column not shown by default: show it after the shares
        keys.insert(keys.index("cumulative_percent") + 1, order)
    cols = [_column(k, result) for k in keys]
    if not _fitted(options):
        return cols, {c.key: None for c in cols}
    caps = {c.key: _WIDTH.get(c.key) if c.clippable and not explicit else None for c in cols}
    pad = header_padding(options.format)
    natural = {"#": max(1 + pad, len(str(len(result.rows))))}
    least: dict[str, int] = {}
    for c in cols:
        longest = max((len(c.cell(r, caps[c.key])) for r in result.rows), default=0)
        natural[c.key] = max(len(c.header) + pad, longest)
        least[c.key] = (max(len(c.header) + pad, min(natural[c.key], _MIN_WIDTH.get(c.key, _MIN_OTHER)))
                        if c.clippable else natural[c.key])
    keep = {c.key for c in cols} if explicit else _essential(result)
    shown, widths = _fit(cols, natural, least, keep, options.format, options.width or terminal_width())
    return shown, {c.key: widths[c.key] if c.clippable else None for c in shown}


def _title(result: TableResult) -> str:
    options = result.options
    s = result.summary
    n, total = len(result.rows), result.total_rows
    if options.aggregated and options.aggregate_by is None:
        what = f"all selected nodes as one row ({options.aggregate_fn})"
    else:
        noun = plural(total, "node") if not options.aggregated else plural(total, f"{options.aggregate_by} group")
        what = (f"top {n} of {noun}" if n < total else f"all {noun}" if total > 1 else noun)
        if options.aggregated:
            what += f" ({options.aggregate_fn} over nodes)"
    direction = "ascending" if result.order.ascending else "descending"
    return (f"{what}, ordered by {result.order.column.key} {direction}; "
            f"time: {s.stat} of {plural(s.steps, 'profiled step')}, {clock_label(result.clock)}")


def render_rows(result: TableResult, fmt: str = "simple") -> str:
    """The table part: a title line and the rows (or why there are none), fitted to the width."""
    if not result.rows:
        return f"no rows: {result.note}" if result.note else "no rows: the profile has no nodes"
    cols, widths = _layout(result)
    body = [[str(row.rank), *(c.cell(row, widths[c.key]) for c in cols)] for row in result.rows]
    table = text_table(body, ["#", *(c.header for c in cols)], fmt)
    title = _title(result)
    if _fitted(result.options):
        title = textwrap.fill(title, result.options.width or terminal_width(), break_on_hyphens=False)
    return title + "\n" + table


def summary_items(result: TableResult) -> list[tuple[str, str]]:
    """The summary as (label, text) pairs, in print order."""
    s = result.summary
    device = s.device_type + (f" ({s.device_name})" if s.device_name else "")
    items = [
        ("profile", f"{s.function or '?'} on {device}: {plural(s.graphs, 'graph')}, "
                    f"{plural(s.nodes, 'node')}, {plural(s.steps, 'profiled step')}"),
        ("total time", f"{format_time(s.total_time_s)} per step (sum of node {s.stat}s, {clock_label(s.clock)})"),
    ]
    if s.step_wall_time_s is not None:
        items.append(("step wall time", f"{format_time(s.step_wall_time_s)} ({s.stat})"))
    for p in s.phases:
        items.append((f"{p.phase} time", f"{format_time(p.time_s)} ({p.percent:.1f}%) in {plural(p.nodes, 'node')}"))
    if s.total_flops is None:
        items.append(("FLOPs", "N/A (no node has a FLOP count)"))
    else:
        items.append(("FLOPs", f"{format_count(s.total_flops, 'FLOP')} per step ({s.flops_nodes} of {s.nodes} nodes, "
                               f"{100 * s.flops_time_share:.1f}% of the time)"))
        items.append(("achieved FLOP/s", format_count(s.achieved_flop_per_s, "FLOP/s")))
    if s.total_bytes_moved is not None:
        items.append(("bytes moved", f"{format_bytes(s.total_bytes_moved)} per step"))
        items.append(("achieved bandwidth", format_bytes(s.achieved_bandwidth_bytes_per_s, "B/s")))
    if s.peak_live_bytes is not None:
        items.append(("peak live memory", f"{format_bytes(s.peak_live_bytes)} after {s.peak_live_node}"))
    if result.options.filtered:
        from graphprof.analysis.filters import describe_filters

        share = 100.0 * result.matched_time_s / s.total_time_s if s.total_time_s > 0 else 0.0
        items.append(("selected", f"{result.matched_nodes} of {s.nodes} nodes, {format_time(result.matched_time_s)} "
                                  f"({share:.1f}%) by {describe_filters(result.options)}"))
    return items


def render_summary(result: TableResult, fmt: str = "simple") -> str:
    """The summary block as a two-column table in ``fmt``; long values wrap to the width.

    Each value is one line of prose holding names from the profile (its function, device, peak node)
    and the user's filters: ``terminal_line`` shows a newline or escape sequence in them as ``\\n``, ``\\x1b``.
    """
    items = [(label, terminal_line(text)) for label, text in summary_items(result)]
    if _fitted(result.options) and items:
        label = max(len(k) for k, _ in items)
        room = max((result.options.width or terminal_width()) - label - format_overhead(fmt, 2), 20)
        items = [(k, textwrap.fill(v, room, break_on_hyphens=False)) for k, v in items]
    return text_table(items, (), fmt)


def render_table(result: TableResult) -> str:
    """The text ``graphprof analyze`` prints, in ``result.options.format`` (``print_only`` respected)."""
    options = result.options
    check_format(options.format)
    if options.format in DATA_FORMATS:
        from graphprof.render.tabular import render_csv, render_json

        return (render_json if options.format == "json" else render_csv)(result)
    parts: list[Any] = []
    if options.print_only in (None, "summary"):
        parts.append(render_summary(result, options.format))
    if options.print_only in (None, "table"):
        parts.append(render_rows(result, options.format))
    return "\n\n".join(parts)
