"""A profile table in the spirit of MegEngine's ``profile_analyze`` and torch's ``key_averages``.

``build_table(profile, options)`` is the whole analysis behind
``graphprof analyze`` and ``Profile.table``: per-node times under a statistic,
filters, optional aggregation, ordering by any column, the top rows, and the
summary. It returns plain numbers in SI units; renderers decide how they look.

Steps, in order (as in profile_analyze): time every node, filter single
nodes, aggregate, order, cut to ``top``, then compute cumulative shares in the
printed order. Percentages are shares of the whole profile's time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, Sequence

from graphprof.analysis.aggregate import aggregate
from graphprof.analysis.columns import (MEMORY_KEYS, SHAPES, OrderBy, order_entries, parse_order_by, resolve_columns,
                                        value_getter)
from graphprof.analysis.entries import NodeEntry, ratio
from graphprof.analysis.filters import resolve_clock, select, why_empty
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.options import TableOptions, make_options
from graphprof.analysis.summary import Summary, summarize
from graphprof.profile.model import Profile

Shapes = tuple[tuple[int, ...] | None, ...]


@dataclass(frozen=True)
class Row:
    """One printed row: a node, or a group of nodes when the table is aggregated.

    Descriptive fields of a group hold its nodes' common value, or None when
    they differ; ``id`` is None for groups. Unknown numbers are None.
    """

    rank: int
    label: str
    calls: int
    time_s: float
    percent: float
    cumulative_percent: float
    flops: float | None
    flop_per_s: float | None
    bytes_moved: float | None
    bytes_read: float | None
    bytes_written: float | None
    bandwidth_bytes_per_s: float | None
    intensity_flop_per_byte: float | None
    allocated_bytes: float | None
    freed_bytes: float | None
    live_bytes: float | None
    id: int | None
    name: str | None
    op: str | None
    type: str | None
    module: str | None
    module_type: str | None
    source: str | None
    phase: str | None
    scope: str | None
    graph: str | None
    in_shapes: Shapes | None
    out_shapes: Shapes | None
    in_dtypes: tuple[str | None, ...] | None


ROW_FIELDS = tuple(f.name for f in fields(Row))
_FROM_ENTRY = tuple(k for k in ROW_FIELDS if k not in ("rank", "cumulative_percent"))


@dataclass(frozen=True)
class TableResult:
    """Everything a renderer needs: the summary, the rows, and how they were chosen.

    ``matched_nodes`` and ``matched_time_s`` describe the selection after
    filters; ``total_rows`` counts rows before the ``top`` cut. ``has_memory``
    says whether memory columns carry data. ``note`` explains an empty table.
    """

    options: TableOptions
    summary: Summary
    rows: tuple[Row, ...]
    order: OrderBy
    clock: str
    total_time_s: float
    matched_nodes: int
    matched_time_s: float
    total_rows: int
    has_memory: bool
    note: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The row fields ``--columns`` names, in its order; by default every field that carries
        data in this table (memory ones only when recorded)."""
        if self.options.columns:
            return resolve_columns(self.options.columns)
        return tuple(k for k in ROW_FIELDS if self.has_memory or k not in MEMORY_KEYS)


def _row(entry: Any, rank: int, cumulative_percent: float) -> Row:
    values = {k: getattr(entry, k) for k in _FROM_ENTRY}
    return Row(rank=rank, cumulative_percent=cumulative_percent, **values)


def _node_entries(frame: NodeFrame, times: list[float], indices: Sequence[int], total: float) -> list[NodeEntry]:
    """Entries of the nodes ``indices``: only these nodes' records are needed (``frame.pair``)."""
    pair = frame.pair if len(indices) < len(frame) else frame.pairs.__getitem__
    return [NodeEntry(*pair(i), times[i], total, i) for i in indices]


def _ordered(frame: NodeFrame, times: list[float], indices: Sequence[int], options: TableOptions,
             order: OrderBy, total: float) -> tuple[list[Any], int]:
    """The entries to print, in order, and how many rows there were before the ``top`` cut."""
    if options.aggregated:
        groups = aggregate(frame, times, indices, options, total)
        ordered = order_entries(groups, order)
        return (ordered[: options.top] if options.top else ordered), len(groups)
    if order.column.key in ("time_s", "percent"):
        # The common case on big profiles: order indices by time, build entries for shown rows only.
        # heapq's nlargest/nsmallest equal sorted(...)[:n], ties included, so both paths agree.
        key = times.__getitem__
        if options.top and options.top < len(indices):
            pick = heapq.nsmallest if order.ascending else heapq.nlargest
            shown = pick(options.top, indices, key=key)
        else:
            shown = sorted(indices, key=key, reverse=not order.ascending)
        return _node_entries(frame, times, shown, total), len(indices)
    ordered_indices = _order_indices(frame, times, indices, order)
    shown = ordered_indices[: options.top] if options.top else ordered_indices
    return _node_entries(frame, times, shown, total), len(indices)


#: Entry columns that are not a frame column: how a node entry computes them from the frame.
_RATIOS = {"flop_per_s": ("flops", None), "bandwidth_bytes_per_s": ("bytes_moved", None),
           "intensity_flop_per_byte": ("flops", "bytes_moved")}


def _sort_values(frame: NodeFrame, times: list[float], key: str) -> list[Any]:
    """Every node's value of entry column ``key`` (``NodeEntry``'s attribute), read from the frame."""
    if key == "calls":
        return [1] * len(times)
    if key in _RATIOS:
        numerator, denominator = _RATIOS[key]
        return list(map(ratio, frame.column(numerator), times if denominator is None else frame.column(denominator)))
    return frame.column(key)


def _order_indices(frame: NodeFrame, times: list[float], indices: Sequence[int], order: OrderBy) -> list[int]:
    """``indices`` as ``order_entries`` orders their node entries (unknown values last, ties in the
    given order), reading only the ordered column: no entry or record is made for a node not shown."""
    column = order.column
    values = _sort_values(frame, times, column.key)
    if column.kind == SHAPES:  # order by columns.value_getter's key, made once per distinct shape list
        get = value_getter(column)
        keys = {v: get(SimpleNamespace(**{column.key: v})) for v in set(values) if v is not None}
        values = [None if v is None else keys[v] for v in values]
    known = [i for i in indices if values[i] is not None]
    known.sort(key=values.__getitem__, reverse=not order.ascending)
    return known + [i for i in indices if values[i] is None]


def build_table(profile: Profile, options: TableOptions | None = None, **kwargs: Any) -> TableResult:
    """The table of ``profile`` under ``options`` (or the keyword options of ``make_options``)."""
    if options is None:
        options = make_options(**kwargs)
    elif kwargs:
        raise TypeError("pass either options or keyword options, not both")
    else:
        options.validate()
    order = parse_order_by(options.order_by)
    clock = resolve_clock(profile, options.clock)
    frame = node_frame(profile)
    times = frame.times(options.stat, clock)
    summary = frame.memo(("summary", options.stat, clock),
                         lambda: summarize(profile, frame, times, options.stat, clock))
    total = summary.total_time_s
    indices = select(frame, options, times)
    note = why_empty(profile, options) if not indices and len(frame) else None
    shown, total_rows = _ordered(frame, times, indices, options, order, total)
    rows = []
    cumulative = 0.0
    for rank, entry in enumerate(shown, start=1):
        cumulative += entry.time_s
        rows.append(_row(entry, rank, 100.0 * cumulative / total if total > 0 else 0.0))
    return TableResult(
        options=options, summary=summary, rows=tuple(rows), order=order, clock=clock, total_time_s=total,
        matched_nodes=len(indices),
        # every node selected: the summary's total is this same fsum of the same times
        matched_time_s=total if len(indices) == len(times) else math.fsum(map(times.__getitem__, indices)),
        total_rows=total_rows,
        has_memory=summary.peak_live_bytes is not None, note=note,
    )
