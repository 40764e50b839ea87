"""Folding selected nodes into groups: ``--aggregate`` and ``--aggregate-by``.

The aggregate function (sum, mean, max, min) applies to every measured column
over the group's nodes, as in MegEngine's profile_analyze; rates (FLOP/s,
bandwidth, intensity) are then recomputed from the aggregated values, never
averaged. Choices where profile_analyze was silent or surprising:

* Unknown values (``flops`` of an op without a formula) are left out, not
  counted as 0: the mean FLOPs of a group is the mean over its nodes that have
  a count, and a group whose nodes all lack one shows N/A.
* ``live_bytes`` under ``sum`` is the group's peak (max): a sum of live bytes
  after different nodes means nothing.
* ``calls`` is the number of nodes in the group (per profiled step).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Hashable, Sequence

from graphprof.analysis.entries import GroupEntry
from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.options import TableOptions

_MEASURED = ("flops", "bytes_read", "bytes_written", "bytes_moved", "allocated_bytes", "freed_bytes", "live_bytes")
_DESCRIPTIVE = ("name", "op", "type", "module", "module_type", "source", "phase", "scope", "graph",
                "in_shapes", "out_shapes", "in_dtypes")

def _sum(xs: Sequence[float]) -> float:
    """Exact for integers (FLOPs, bytes), accurate for floats (times)."""
    return math.fsum(xs) if float in map(type, xs) else sum(xs)


_FUNCS: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": _sum,
    "mean": lambda xs: math.fsum(xs) / len(xs),
    "max": max,
    "min": min,
}


def truncate_module(path: str, depth: int | None) -> str:
    """``layer1.0.conv1`` at depth 1 is ``layer1``; no depth keeps the path, depth 0 and "" give "".

    The one module-path prefix of tables, diff groups, graph views and the HTML
    report (which label "" as top level themselves).
    """
    if depth is None or not path:
        return path
    return ".".join(path.split(".")[:depth])


def _group_keys(frame: NodeFrame, indices: Sequence[int], by: str | None,
                module_depth: int | None) -> tuple[list[Hashable], Callable[[Hashable, int], str]]:
    """The grouping key of each selected node, and a function giving a group's label from (key, first index)."""
    if by is None:
        return ["all"] * len(indices), lambda key, first: "all"
    if by == "module":
        column = frame.column("module")
        truncated: dict[str, str] = {}
        keys: list[Hashable] = []
        for i in indices:
            path = column[i]
            key = truncated.get(path)
            if key is None:
                key = truncated[path] = truncate_module(path, module_depth)
            keys.append(key)
        return keys, lambda key, first: key  # type: ignore[return-value]
    if by == "shape":
        types, shapes = frame.column("type"), frame.column("in_shapes")
        return [(types[i], shapes[i]) for i in indices], lambda key, first: key[0]  # type: ignore[index]
    if by == "graph":
        pairs = frame.pairs
        return [pairs[i][0].id for i in indices], lambda key, first: pairs[first][0].name
    column = frame.column(by)  # phase is its value, like every other text column
    return [column[i] for i in indices], lambda key, first: key  # type: ignore[return-value]


def _gatherer(members: list[int]) -> Callable[[Sequence[Any]], list[Any]]:
    """A function taking the members' values out of a column, as a list."""
    if len(members) == 1:
        only = members[0]
        return lambda column: [column[only]]
    get = operator.itemgetter(*members)
    return lambda column: list(get(column))


def _common(values: list[Any]) -> Any:
    """The members' shared value, or None when they differ."""
    first = values[0]
    return first if values.count(first) == len(values) else None


def _reduce(fn: Callable[[Sequence[float]], float], values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return fn(known)


def aggregate(frame: NodeFrame, times: Sequence[float], indices: Sequence[int], options: TableOptions,
              total_time_s: float) -> list[GroupEntry]:
    """One GroupEntry per group of the selected nodes (``indices`` into ``frame``), in order of each group's first node.

    Works column by column over index lists: a report aggregates a 100,000-node
    profile four times, and reading each value through an entry object was most of that time.
    """
    keys, label_of = _group_keys(frame, indices, options.aggregate_by, options.module_depth)
    groups: dict[Hashable, list[int]] = {}
    for key, i in zip(keys, indices):
        members = groups.get(key)
        if members is None:
            groups[key] = [i]
        else:
            members.append(i)
    fn = _FUNCS[options.aggregate_fn]
    columns = {key: frame.column(key) for key in (*_MEASURED, *_DESCRIPTIVE)}
    out = []
    for order, (key, members) in enumerate(groups.items()):
        gather = _gatherer(members)  # one C-level gather per column, not a Python loop per value
        values: dict[str, Any] = {"calls": len(members), "time_s": fn(gather(times))}
        for name in _MEASURED:
            column_fn = _FUNCS["max"] if name == "live_bytes" and options.aggregate_fn == "sum" else fn
            values[name] = _reduce(column_fn, gather(columns[name]))
        for name in _DESCRIPTIVE:
            values[name] = _common(gather(columns[name]))
        label = label_of(key, members[0])
        if options.aggregate_by == "module":
            values["module"] = label
        out.append(GroupEntry(label, total_time_s, order, values))
    return out
