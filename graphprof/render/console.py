"""Console rendering of analysis results with tabulate."""

from __future__ import annotations

from tabulate import tabulate

from graphprof.analysis.table import NodeTable
from graphprof.render.units import format_shapes, format_time


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def render_node_table(table: NodeTable, fmt: str = "simple") -> str:
    """The node table as text: op, module, source, shapes, self time, %."""
    headers = ["#", "op", "module", "source", "in shapes", f"self time ({table.stat})", "%", "cum %"]
    body = [
        [
            row.id, row.type, _clip(row.module or "-", 32), _clip(row.source or "-", 32),
            _clip(format_shapes(row.in_shapes), 40), format_time(row.time_s),
            f"{row.percent:.1f}", f"{row.cumulative_percent:.1f}",
        ]
        for row in table.rows
    ]
    title = f"total {format_time(table.total_time_s)} per step ({table.stat} of {table.steps} steps)"
    return title + "\n" + tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)
