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
from typing import Any, Callable, Hashable, Sequence

from graphprof.analysis.entries import GroupEntry, NodeEntry
from graphprof.analysis.options import TableOptions

_MEASURED = ("flops", "bytes_read", "bytes_written", "bytes_moved", "allocated_bytes", "freed_bytes", "live_bytes")
_DESCRIPTIVE = ("name", "op", "type", "module", "module_type", "source", "phase", "scope", "graph",
                "in_shapes", "out_shapes", "in_dtypes")

def _sum(xs: Sequence[float]) -> float:
    """Exact for integers (FLOPs, bytes), accurate for floats (times)."""
    return math.fsum(xs) if any(type(x) is float for x in xs) else sum(xs)


_FUNCS: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": _sum,
    "mean": lambda xs: math.fsum(xs) / len(xs),
    "max": max,
    "min": min,
}


def truncate_module(path: str, depth: int | None) -> str:
    """``layer1.0.conv1`` at depth 1 is ``layer1``; no depth keeps the path."""
    if depth is None or not path:
        return path
    return ".".join(path.split(".")[:depth])


def group_key(entry: NodeEntry, by: str | None, module_depth: int | None) -> tuple[Hashable, str]:
    """The grouping key of a node and its printed label."""
    node = entry.node
    if by is None:
        return "all", "all"
    if by == "module":
        module = truncate_module(node.module, module_depth)
        return module, module
    if by == "shape":
        return (node.type, node.in_shapes), node.type
    if by == "phase":
        return node.phase.value, node.phase.value
    if by == "graph":
        return entry.graph_record.id, entry.graph_record.name
    value = getattr(node, by)
    return value, value


def _common(members: Sequence[Any], key: str) -> Any:
    """The members' shared value of ``key``, or None; stops at the first difference."""
    first = getattr(members[0], key)
    for m in members:
        if getattr(m, key) != first:
            return None
    return first


def _reduce(fn: Callable[[Sequence[float]], float], values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return fn(known)


def aggregate(entries: Sequence[NodeEntry], options: TableOptions, total_time_s: float) -> list[GroupEntry]:
    """One GroupEntry per group, in order of each group's first node."""
    groups: dict[Hashable, tuple[str, list[NodeEntry]]] = {}
    for entry in entries:
        key, label = group_key(entry, options.aggregate_by, options.module_depth)
        slot = groups.get(key)
        if slot is None:
            groups[key] = (label, [entry])
        else:
            slot[1].append(entry)
    fn = _FUNCS[options.aggregate_fn]
    out = []
    for order, (label, members) in enumerate(groups.values()):
        values: dict[str, Any] = {"calls": len(members), "time_s": fn([m.time_s for m in members])}
        for key in _MEASURED:
            column_fn = _FUNCS["max"] if key == "live_bytes" and options.aggregate_fn == "sum" else fn
            values[key] = _reduce(column_fn, [getattr(m, key) for m in members])
        for key in _DESCRIPTIVE:
            values[key] = _common(members, key)
        if options.aggregate_by == "module":
            values["module"] = label
        out.append(GroupEntry(label, total_time_s, order, values))
    return out
