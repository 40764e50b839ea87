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
from typing import Any, Callable, Sequence

import numpy as np

from graphprof.analysis.entries import GroupEntry
from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.node_arrays import (CODED_COLUMNS, codes, column_codes, exact_sum, first_seen_codes, group_order,
                                           int_array)
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
    return ".".join(path.split(".", depth)[:depth])  # no more splits than the parts kept


def _group_codes(frame: NodeFrame, indices: Sequence[int], by: str | None,
                 module_depth: int | None) -> tuple[np.ndarray, list[Any], Callable[[Any, int], str]]:
    """Each selected node's group (numbered in order of first appearance), the group keys, and a
    function giving a group's label from (key, first index)."""
    chosen = None if _is_everything(frame, indices) else np.asarray(indices, dtype=np.intp)
    if by is None:
        return np.zeros(len(indices), dtype=np.intp), ["all"] if len(indices) else [], lambda key, first: "all"
    if by == "shape":
        types, shapes = frame.column("type"), frame.column("in_shapes")
        group, keys = codes([(types[i], shapes[i]) for i in indices])
        return group, keys, lambda key, first: key[0]
    if by == "graph":
        raw, values = column_codes(frame, "graph_id")
        names = frame.column("graph")
        group, keys = first_seen_codes(raw if chosen is None else raw[chosen], values)
        return group, keys, lambda key, first: names[first]
    if by == "module":
        raw, values = frame.memo(("module_codes", module_depth), lambda: _module_codes(frame, module_depth))
    else:
        raw, values = column_codes(frame, by)  # phase is its value, like every other text column
    group, keys = first_seen_codes(raw if chosen is None else raw[chosen], values)
    return group, keys, lambda key, first: key


def _module_codes(frame: NodeFrame, depth: int | None) -> tuple[np.ndarray, list[Any]]:
    """Codes of the module paths cut to ``depth`` (first-seen order), and those paths."""
    raw, paths = column_codes(frame, "module")
    to_key, keys = truncated_codes(paths, depth)  # type: ignore[arg-type]
    return to_key[raw], keys


def truncated_codes(paths: Sequence[str], depth: int | None) -> tuple[np.ndarray, list[Any]]:
    """Each of the distinct module ``paths``' code among the paths cut to ``depth`` (first-seen order),
    and those cut paths: what module codes become when a table or diff groups by a module depth."""
    return codes([truncate_module(path, depth) for path in paths])


def _is_everything(frame: NodeFrame, indices: Sequence[int]) -> bool:
    return isinstance(indices, range) and indices.start == 0 and indices.step == 1 and len(indices) == len(frame)


def _common(values: list[Any]) -> Any:
    """The members' shared value, or None when they differ."""
    first = values[0]
    return first if values.count(first) == len(values) else None


def _reduce(fn: Callable[[Sequence[float]], float], values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return fn(known)


#: Members a group must have before its columns are reduced over arrays rather than lists.
_ARRAY_GROUP = 64
#: How many members ``_common`` compares before gathering them all: values that differ usually show there.
_PROBES = 8


def _common_of(column: Sequence[Any], members: list[int]) -> Any:
    """``_common`` of the members' values; a few members are compared first, so a column whose values
    differ is not gathered whole. Values compare as ``list.count`` does (identity, then ==)."""
    first = column[members[0]]
    step = max(1, len(members) // _PROBES)
    for k in range(step, len(members), step):
        value = column[members[k]]
        if value is not first and value != first:
            return None
    get = operator.itemgetter(*members)
    return _common([get(column)] if len(members) == 1 else list(get(column)))


def _common_code(frame: NodeFrame, name: str, members: np.ndarray) -> Any:
    """``_common_of`` a big group over the column's codes (equal values, equal codes): no list of the
    members' values is gathered."""
    found, values = column_codes(frame, name)
    chosen = found[members]
    return values[chosen[0]] if (chosen == chosen[0]).all() else None


def _reduce_ints(frame: NodeFrame, name: str, members: np.ndarray, fn_name: str) -> Any:
    """``_reduce`` of an all-integer column over arrays (the same value; ValueError if not all integers)."""
    values, known = int_array(frame, name)
    chosen = values[members][known[members]]
    if not len(chosen):
        return None
    if fn_name == "sum":
        return exact_sum(chosen)
    if fn_name == "mean":
        return math.fsum(chosen.astype(np.float64).tolist()) / len(chosen)  # fsum converts each int alike
    return int(chosen.max() if fn_name == "max" else chosen.min())


class _Group(GroupEntry):
    """A group whose columns other than its time are reduced on first use.

    A report aggregates a 100,000-node profile four times and prints ten
    groups of each: reducing every column of every group was most of that work.
    """

    def __init__(self, label: str, total_time_s: float, order: int, values: dict[str, Any],
                 frame: NodeFrame, members: list[int], member_array: np.ndarray, options: TableOptions) -> None:
        super().__init__(label, total_time_s, order, values)
        self._frame = frame
        self._members = members
        self._member_array = member_array
        self._options = options

    def __getattr__(self, name: str) -> Any:  # only called for a column not reduced yet
        if name in _DESCRIPTIVE:
            if len(self._members) >= _ARRAY_GROUP and name in CODED_COLUMNS:
                value = _common_code(self._frame, name, self._member_array)
            else:
                value = _common_of(self._frame.column(name), self._members)
        elif name in _MEASURED:
            fn_name = self._options.aggregate_fn
            fn_name = "max" if name == "live_bytes" and fn_name == "sum" else fn_name
            value = None
            if len(self._members) >= _ARRAY_GROUP:
                try:
                    value = _reduce_ints(self._frame, name, self._member_array, fn_name)
                except ValueError:
                    value = _reduce(_FUNCS[fn_name], self._gather(name))
            else:
                value = _reduce(_FUNCS[fn_name], self._gather(name))
        else:
            raise AttributeError(name)
        setattr(self, name, value)
        return value

    def _gather(self, name: str) -> list[Any]:
        column = self._frame.column(name)
        get = operator.itemgetter(*self._members)
        return [get(column)] if len(self._members) == 1 else list(get(column))


def aggregate(frame: NodeFrame, times: Sequence[float], indices: Sequence[int], options: TableOptions,
              total_time_s: float) -> list[GroupEntry]:
    """One GroupEntry per group of the selected nodes (``indices`` into ``frame``), in order of each group's first node.

    Groups are formed over arrays (a code per node, a stable sort by group);
    each group's time is reduced at once, its other columns when first read.
    """
    group, keys, label_of = _group_codes(frame, indices, options.aggregate_by, options.module_depth)
    order = group_order(group, len(keys))
    member_array = order if _is_everything(frame, indices) else np.asarray(indices, dtype=np.intp)[order]
    members_of = member_array.tolist()
    ends = np.cumsum(np.bincount(group, minlength=len(keys))).tolist()
    member_times = list(operator.itemgetter(*members_of)(times)) if len(members_of) > 1 else \
        [times[i] for i in members_of]
    fn = _FUNCS[options.aggregate_fn]
    out: list[GroupEntry] = []
    start = 0
    for number, (key, end) in enumerate(zip(keys, ends)):
        members = members_of[start:end]
        values: dict[str, Any] = {"calls": len(members), "time_s": fn(member_times[start:end])}
        label = label_of(key, members[0])
        if options.aggregate_by == "module":
            values["module"] = label
        out.append(_Group(label, total_time_s, number, values, frame, members, member_array[start:end], options))
        start = end
    return out
