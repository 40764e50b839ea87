"""The text of ``graphprof diff`` and ``Profile.diff``: a summary, then what changed.

Summary: both profiles side by side with the change (nodes, total time,
median step time with its noise margin, FLOPs), how nodes were matched, and
the regression gate's verdict. Then the changed node pairs ordered by
absolute time change (``--top`` of them), and the changed groups by op type,
module and phase; with ``--aggregate-by`` only that grouping. Unchanged
nodes and groups are not printed: two identical profiles print "no change".
Any tabulate format works; ``csv`` and ``json`` go through
``graphprof.render.diff_data``. Names from the profiles (functions, devices,
graphs, op types, modules) are shown as ``terminal_line`` shows them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from graphprof.analysis.node_time import clock_label
from graphprof.analysis.diff import DiffResult, GroupDiff, NodeDiff
from graphprof.analysis.match import MatchKind
from graphprof.analysis.options import DATA_FORMATS
from graphprof.render.console import check_format
from graphprof.render.diff_data import changed_groups, render_diff_csv, render_diff_json, top_rows
from graphprof.render.escape import terminal_line
from graphprof.render.fit import text_table
from graphprof.render.units import format_count, format_shapes, format_time, plural

_ORDER_TITLES = {"time": "|time change|", "flops": "|FLOPs change|", "delta_time": "time change",
                 "delta_flops": "FLOPs change", "before_time": "time before", "after_time": "time after"}
_BY_TITLES = {"type": "op type", "module": "module", "phase": "phase", "source": "source line",
              "scope": "scope", "shape": "op type and input shapes", "graph": "graph", "all": "all selected nodes"}


def signed_time(seconds: float | None) -> str:
    """``+1.2 ms`` / ``-30 us`` / ``0``."""
    if seconds is None:
        return "N/A"
    if seconds == 0:
        return "0"
    return ("+" if seconds > 0 else "-") + format_time(abs(seconds))


def signed_flops(flops: float | None) -> str:
    """``+16.4 KFLOP`` / ``-2 KFLOP`` / ``0``; N/A when a side has no FLOP count."""
    if flops is None:
        return "N/A"
    if flops == 0:
        return "0"
    return ("+" if flops > 0 else "-") + format_count(abs(flops), "FLOP")


def format_ratio(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.2f}x"


def _percent(delta: float | None, base: float | None) -> str:
    if delta is None or base is None or not base > 0:
        return ""
    return f" ({100.0 * delta / base:+.1f}%)"


def _summary_rows(result: DiffResult) -> list[list[str]]:
    a, b, s = result.before, result.after, result.steps
    rows = [
        ["profile", terminal_line(f"{a.function or '?'} on {a.device}"), terminal_line(f"{b.function or '?'} on {b.device}"),
         ""],
        ["graphs / nodes", f"{a.graphs} / {a.nodes}", f"{b.graphs} / {b.nodes}", f"{b.nodes - a.nodes:+d} nodes"],
        ["profiled steps", str(a.steps), str(b.steps), ""],
        [f"total time (sum of node {result.options.stat}s)", format_time(a.total_time_s), format_time(b.total_time_s),
         signed_time(result.delta_time_s) + _percent(result.delta_time_s, a.total_time_s)],
    ]
    noise = "noise not estimable (fewer than 2 steps)" if s.noise_margin_s is None else \
        f"noise margin ±{format_time(s.noise_margin_s)}"
    rows.append(["step time (median)", format_time(s.before_median_s), format_time(s.after_median_s),
                 f"{signed_time(s.delta_s)}{_percent(s.delta_s, s.before_median_s)}, {noise}"])
    rows.append(["FLOPs", format_count(a.total_flops, "FLOP"), format_count(b.total_flops, "FLOP"),
                 signed_flops(result.delta_flops) + _percent(result.delta_flops, a.total_flops)])
    return rows


def _matching_line(result: DiffResult) -> str:
    c = result.counts
    only_a = [a for a, b in result.graph_pairs if b is None]
    only_b = [b for a, b in result.graph_pairs if a is None]
    graphs = "".join(f"; graphs only in {side}: {', '.join(map(terminal_line, names))}"
                     for side, names in (("before", only_a), ("after", only_b)) if names)
    if result.mode == "aggregate":
        before = ", ".join(terminal_line(a) for a, _ in result.graph_pairs if a is not None) or "no graph"
        after = ", ".join(terminal_line(b) for _, b in result.graph_pairs if b is not None) or "no graph"
        return f"no shared graph structure (before: {before}; after: {after}): compared by op type and module"
    return (f"{c['matched']} matched, {c['modified']} modified (same op on other shapes or under another module path), "
            f"{c['added']} added, {c['removed']} removed{graphs}")


def render_diff_summary(result: DiffResult, fmt: str = "simple") -> str:
    """Both profiles side by side, the matching, and the gate's verdict."""
    text = text_table(_summary_rows(result), ["", "before", "after", "change"], fmt)
    lines = [text, "nodes: " + _matching_line(result)]
    if result.gate is not None:
        lines.append(f"regression gate: {'FAIL' if result.gate.regressed else 'pass'}: {result.gate.reason}")
    return "\n".join(lines)


def _name(value: object) -> str:
    """A name from a profile for a cell (``terminal_line``); an unknown one is an empty cell, as tabulate shows None."""
    return "" if value is None else terminal_line(value)


def _shapes(n: NodeDiff) -> str:
    if n.status is MatchKind.MODIFIED and n.before_index is not None and n.after_index is not None:
        before, after = n.side("in_shapes", "before"), n.side("in_shapes", "after")
        if before != after:
            return f"{format_shapes(before, width=30)} -> {format_shapes(after, width=30)}"
    return format_shapes(n.value("in_shapes"), width=36)


def _module(n: NodeDiff) -> str:
    if n.before_index is not None and n.after_index is not None:
        before, after = n.side("module", "before"), n.side("module", "after")
        if before != after:
            return terminal_line(f"{before or '-'} -> {after or '-'}")
    return terminal_line(n.value("module") or "-")


def _node_columns(result: DiffResult) -> list[tuple[str, Callable[[NodeDiff], str]]]:
    cols: list[tuple[str, Callable[[NodeDiff], str]]] = [
        ("status", lambda n: n.status.value), ("time change", lambda n: signed_time(n.delta_time_s)),
        ("ratio", lambda n: format_ratio(n.ratio)), ("before", lambda n: format_time(n.before_time_s)),
        ("after", lambda n: format_time(n.after_time_s)),
    ]
    if result.before.graphs > 1 or result.after.graphs > 1:
        cols.append(("graph", lambda n: _name(n.graph)))
    cols += [("op type", lambda n: _name(n.value("type"))), ("module", _module),
             ("phase", lambda n: n.value("phase")), ("FLOPs change", lambda n: signed_flops(n.delta_flops)),
             ("in shapes", _shapes)]
    return cols


def _group_columns(by: str) -> list[tuple[str, Callable[[GroupDiff], str]]]:
    def nodes(g: GroupDiff) -> str:
        return str(g.after_nodes) if g.before_nodes == g.after_nodes else f"{g.before_nodes} -> {g.after_nodes}"

    return [(_BY_TITLES.get(by, by), lambda g: terminal_line(g.key) if g.key else "-"), ("nodes", nodes),
            ("time change", lambda g: signed_time(g.delta_time_s)), ("ratio", lambda g: format_ratio(g.ratio)),
            ("before", lambda g: format_time(g.before_time_s)), ("after", lambda g: format_time(g.after_time_s)),
            ("FLOPs change", lambda g: signed_flops(g.delta_flops))]


def _table(items: Sequence[Any], cols: list[tuple[str, Callable[[Any], str]]], fmt: str) -> str:
    body = [[str(rank)] + [cell(x) for _, cell in cols] for rank, x in enumerate(items, start=1)]
    return text_table(body, ["#"] + [h for h, _ in cols], fmt)


def _order_text(result: DiffResult) -> str:
    o = result.order
    return f"ordered by {_ORDER_TITLES.get(o.key, o.key)} {'ascending' if o.ascending else 'descending'}"


def render_node_table(result: DiffResult, fmt: str = "simple") -> str:
    """The changed node pairs, or why there are none."""
    if result.mode == "aggregate":
        return "no node-by-node diff: the profiles share no graph structure"
    if result.note:
        return f"no nodes: {result.note}"
    changed = result.changed
    if not changed:
        return f"no changed nodes: all {plural(len(result.nodes), 'selected node pair')} have equal times and FLOPs"
    shown = top_rows(changed, result.options.top)
    what = f"top {len(shown)} of " if len(shown) < len(changed) else ""
    title = (f"{what}{plural(len(changed), 'changed node')} ({len(result.nodes)} selected), {_order_text(result)}; "
             f"time: {result.options.stat} over profiled steps, {clock_label(result.clock)}")
    return title + "\n" + _table(shown, _node_columns(result), fmt)


def render_group_table(result: DiffResult, by: str, fmt: str = "simple") -> str:
    """The changed groups of one grouping, or a line saying none changed."""
    groups = changed_groups(result.aggregates[by])
    fn = result.options.aggregate_fn
    how = f" ({fn} over nodes)" if fn != "sum" else ""
    if not groups:
        return f"by {_BY_TITLES.get(by, by)}: no change"
    shown = top_rows(groups, result.options.top)
    what = f"top {len(shown)} of " if len(shown) < len(groups) else ""
    return (f"by {_BY_TITLES.get(by, by)}{how}: {what}{plural(len(groups), 'changed group')}, {_order_text(result)}\n"
            + _table(shown, _group_columns(by), fmt))


def render_diff(result: DiffResult) -> str:
    """The text ``graphprof diff`` prints, in ``result.options.format`` (``print_only`` respected)."""
    options = result.options
    check_format(options.format)
    if options.format in DATA_FORMATS:
        return (render_diff_json if options.format == "json" else render_diff_csv)(result)
    fmt = options.format
    parts: list[str] = []
    if options.print_only in (None, "summary"):
        parts.append(render_diff_summary(result, fmt))
    if options.print_only in (None, "table"):
        if options.aggregated:
            parts.append(render_group_table(result, options.aggregate_by or "all", fmt))
        else:
            parts.append(render_node_table(result, fmt))
            parts += [render_group_table(result, by, fmt) for by in ("type", "module", "phase")]
    return "\n\n".join(parts)
