"""Console rendering of a profile table (``graphprof analyze``, ``Profile.table``).

Any tabulate table format works (``simple`` by default, ``github`` for
Markdown, ``fancy_grid`` for MegEngine's look); ``csv`` and ``json`` give raw
SI numbers through ``graphprof.render.tabular``. Human units (ns..s,
FLOP..PFLOP, B..GiB) appear only here.
"""

from __future__ import annotations

from typing import Any, Callable

from graphprof.analysis.columns import BY_KEY
from graphprof.analysis.options import DATA_FORMATS, TableOptionError
from graphprof.analysis.table import Row, TableResult
from graphprof.render.escape import terminal_line
from graphprof.render.units import clip, format_bytes, format_count, format_shapes, format_time, format_value

_WIDTH = {"name": 26, "module": 28, "module_type": 16, "source": 30, "scope": 24, "in_shapes": 36, "out_shapes": 24}
_METRICS = ("flops", "flop_per_s", "bytes_moved", "bandwidth_bytes_per_s", "intensity_flop_per_byte")
_MEMORY = ("allocated_bytes", "freed_bytes", "live_bytes")
#: Descriptive columns of an aggregated table, by --aggregate-by (None: one row "all").
_GROUP_COLUMNS: dict[str | None, tuple[str, ...]] = {
    None: ("label",), "type": ("type",), "module": ("module", "module_type"), "source": ("source",),
    "shape": ("type", "in_shapes"), "scope": ("scope",), "phase": ("phase",), "graph": ("graph",),
}
_NODE_COLUMNS = ("id", "name", "type", "module", "source")


def table_formats() -> list[str]:
    """Every --format value: tabulate's table formats plus csv and json."""
    from tabulate import tabulate_formats

    return sorted(set(tabulate_formats) | set(DATA_FORMATS))


def check_format(fmt: str) -> None:
    """Raise TableOptionError unless ``fmt`` is a known output format."""
    if fmt not in table_formats():
        raise TableOptionError(f"--format {fmt!r} is unknown; choose csv, json or a tabulate format such as simple, github, grid")


def _text(row: Row, key: str) -> str:
    value = getattr(row, key)
    if key in ("in_shapes", "out_shapes"):
        return format_shapes(value, limit=None, width=_WIDTH[key])
    if value is None:
        text = "*" if key != "id" else "-"  # a group whose nodes differ
    else:
        text = terminal_line(value) or "-"  # a name's newline or escape sequence shows as \n, \x1b
    return clip(text, _WIDTH[key], keep_end=key in ("module", "source")) if key in _WIDTH else text


def _columns(result: TableResult) -> list[tuple[str, Callable[[Row], str]]]:
    """(header, cell function) of every printed column, in order."""
    options = result.options

    def metric(key: str) -> tuple[str, Callable[[Row], str]]:
        column = BY_KEY[key]
        return column.title, lambda r: format_value(getattr(r, key), column.unit)

    cols: list[tuple[str, Callable[[Row], str]]] = [("#", lambda r: str(r.rank))]
    if options.aggregated:
        for key in _GROUP_COLUMNS[options.aggregate_by]:
            title = "group" if key == "label" else BY_KEY[key].title
            cols.append((title, (lambda k: lambda r: _text(r, k) if k != "label" else r.label)(key)))
        cols.append(("calls", lambda r: str(r.calls)))
    time_title = f"self time ({options.aggregate_fn})" if options.aggregated and options.aggregate_fn != "sum" else "self time"
    cols += [(time_title, lambda r: format_time(r.time_s)), ("%", lambda r: f"{r.percent:.1f}"),
             ("cum %", lambda r: f"{r.cumulative_percent:.1f}")]
    if not options.aggregated:
        keys = _NODE_COLUMNS if result.summary.graphs < 2 else ("graph", *_NODE_COLUMNS)  # ids are per graph
        cols += [(BY_KEY[k].title, (lambda k: lambda r: _text(r, k))(k)) for k in keys]
    cols += [metric(k) for k in _METRICS]
    if result.has_memory:
        cols += [metric(k) for k in _MEMORY]
    if not options.aggregated:
        cols += [("in shapes", lambda r: _text(r, "in_shapes")), ("out shapes", lambda r: _text(r, "out_shapes"))]
    return cols


def _title(result: TableResult) -> str:
    options = result.options
    s = result.summary
    n, total = len(result.rows), result.total_rows
    if options.aggregated and options.aggregate_by is None:
        what = f"all selected nodes as one row ({options.aggregate_fn})"
    else:
        noun = _plural(total, "node") if not options.aggregated else _plural(total, f"{options.aggregate_by} group")
        what = (f"top {n} of {noun}" if n < total else f"all {noun}" if total > 1 else noun)
        if options.aggregated:
            what += f" ({options.aggregate_fn} over nodes)"
    direction = "ascending" if result.order.ascending else "descending"
    return (f"{what}, ordered by {result.order.column.key} {direction}; "
            f"time: {s.stat} of {_plural(s.steps, 'profiled step')}, {result.clock} clock")


def render_rows(result: TableResult, fmt: str = "simple") -> str:
    """The table part: a title line and the rows (or why there are none)."""
    if not result.rows:
        return f"no rows: {result.note}" if result.note else "no rows: the profile has no nodes"
    cols = _columns(result)
    body = [[cell(row) for _, cell in cols] for row in result.rows]
    from tabulate import tabulate

    table = tabulate(body, headers=[h for h, _ in cols], tablefmt=fmt, disable_numparse=True)
    return _title(result) + "\n" + table


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("s" if n != 1 else "")


def summary_items(result: TableResult) -> list[tuple[str, str]]:
    """The summary as (label, text) pairs, in print order."""
    s = result.summary
    device = s.device_type + (f" ({s.device_name})" if s.device_name else "")
    items = [
        ("profile", f"{s.function or '?'} on {device}: {_plural(s.graphs, 'graph')}, "
                    f"{_plural(s.nodes, 'node')}, {_plural(s.steps, 'profiled step')}"),
        ("total time", f"{format_time(s.total_time_s)} per step (sum of node {s.stat}s, {s.clock} clock)"),
    ]
    if s.step_wall_time_s is not None:
        items.append(("step wall time", f"{format_time(s.step_wall_time_s)} ({s.stat})"))
    for p in s.phases:
        items.append((f"{p.phase} time", f"{format_time(p.time_s)} ({p.percent:.1f}%) in {_plural(p.nodes, 'node')}"))
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
    """The summary block as a two-column table in ``fmt``."""
    from tabulate import tabulate

    return tabulate(summary_items(result), tablefmt=fmt, disable_numparse=True)


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
