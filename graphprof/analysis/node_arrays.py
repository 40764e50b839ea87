"""Numeric node columns as numpy arrays, and each graph's span of the flat columns.

Why: the report classifies, groups and sums every node of a profile several
times over. Done node by node in Python that was seconds on 100,000 nodes;
over arrays it is milliseconds. Arrays are derived from the frame's columns
(``NodeFrame.column``/``times``), once per profile (``NodeFrame.memo``), so no
view needs a ``NodeRecord``.

Exactness: integer columns stay integers (int64; a sum that could overflow is
left to Python by the caller), float sums that are printed keep Python's
order of addition (``np.bincount`` with weights and ``np.cumsum`` add in
index order, as a Python loop does); ``math.fsum`` stays ``math.fsum``.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, Sequence

import numpy as np

from graphprof.analysis.frame import NodeFrame, graph_indexed, moved_ints
from graphprof.profile.model import Profile, node_source
from graphprof.profile.node_columns import NodeColumns


def times_array(frame: NodeFrame, stat: str, clock: str) -> np.ndarray:
    """``frame.times(stat, clock)`` as float64 (read-only: shared by every caller)."""
    def build() -> np.ndarray:
        out = np.asarray(frame.times(stat, clock), dtype=np.float64)
        out.flags.writeable = False
        return out
    return frame.memo(("times_array", stat, clock), build)


def int_array(frame: NodeFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column of optional integers as (values with 0 where unknown, known mask).

    ValueError when the column holds anything else (a float in a hand-edited
    file, a count beyond int64): callers then keep to Python's arithmetic.
    """
    def build() -> tuple[np.ndarray, np.ndarray] | None:
        loaded = _loaded_ints(frame, name)
        if loaded is not None:
            known = np.ones(len(loaded), dtype=bool)
            known.flags.writeable = loaded.flags.writeable = False
            return loaded, known
        column = frame.column(name)
        kinds = set(map(type, column))
        if not kinds <= {int, type(None)}:
            return None
        if type(None) in kinds:
            known = np.fromiter(map(operator.is_not, column, itertools.repeat(None)), dtype=bool, count=len(column))
            column = [0 if v is None else v for v in column]
        else:
            known = np.ones(len(column), dtype=bool)
        try:
            values = np.array(column, dtype=np.int64) if column else np.zeros(0, dtype=np.int64)
        except OverflowError:
            return None
        known.flags.writeable = values.flags.writeable = False
        return values, known
    found = frame.memo(("int_array", name), build)
    if found is None:
        raise ValueError(f"column {name!r} is not all integers")
    return found


def _loaded_ints(frame: NodeFrame, name: str) -> np.ndarray | None:
    """Column ``name`` as the int64 arrays its graphs' files were checked as (``NodeColumns.int_column``),
    joined; None unless every graph is loaded and has an integer for every node there."""
    parts = []
    for graph in frame.graphs:
        source = node_source(graph)
        ints = _graph_ints(source, name) if isinstance(source, NodeColumns) else None
        if ints is None:
            return None
        parts.append(ints)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _graph_ints(source: NodeColumns, name: str) -> np.ndarray | None:
    """``NodeColumns.int_column``, and ``bytes_moved`` as the sum of the read and written arrays
    (None where that sum could leave int64, as the conversion of the column would fail)."""
    return moved_ints(source) if name == "bytes_moved" else source.int_column(name)


def exact_sum(values: np.ndarray) -> int:
    """The sum of int64 ``values`` as a Python int: in int64 where it cannot overflow, else in Python.

    An object array (Python numbers) is summed by Python, in order.
    """
    if not len(values):
        return 0
    if values.dtype != object and float(np.abs(values.astype(np.float64)).sum()) < 2.0**62:
        return int(values.sum())
    return sum(values.tolist())


def codes(values: Sequence[object]) -> tuple[np.ndarray, list[object]]:
    """Each value's index among the distinct values in first-seen order, and those values.

    A dict pass, not ``np.unique``: it keeps first-seen order (a table's group
    order) and needs no ordering of the values (tuples, None).
    """
    distinct = list(dict.fromkeys(values))  # C loops only: a profile column has 100,000s of values
    index = {value: i for i, value in enumerate(distinct)}
    out = np.fromiter(map(index.__getitem__, values), dtype=np.intp, count=len(values))
    return out, distinct


def first_seen_codes(selected: np.ndarray, labels: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Renumber value codes so that groups count from 0 in order of their first selected node.

    ``selected``: a code per selected node; ``labels``: the value of each code.
    """
    if not len(selected):
        return selected, []
    present, first = np.unique(selected, return_index=True)
    order = np.argsort(first, kind="stable")
    remap = np.empty(int(present[-1]) + 1, dtype=np.intp)
    remap[present[order]] = np.arange(len(present))
    return remap[selected], [labels[c] for c in present[order].tolist()]


def group_order(codes: np.ndarray, groups: int) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` of group codes in ``range(groups)``: the nodes by group,
    in execution order within each.

    Why: numpy's stable sort is a radix sort for 16-bit integers and a merge
    sort for wider ones; codes of fewer than 65,536 groups sort as uint16 about
    twenty times faster when the groups interleave (op types do). A stable
    sort has one result, so the order is the same.
    """
    if groups <= 1 << 16 and len(codes):
        return np.argsort(codes.astype(np.uint16), kind="stable")
    return np.argsort(codes, kind="stable")


def paired_codes(a: Sequence[Any], b: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """``codes`` of two columns over one table of values (``a``'s first-seen order, then ``b``'s):
    equal values get equal codes on both sides."""
    found, values = codes([*a, *b])
    return found[:len(a)], found[len(a):], values


def merged_codes(a: tuple[np.ndarray, list[Any]],
                 b: tuple[np.ndarray, list[Any]]) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """``paired_codes`` of two columns given as their ``codes`` (codes, distinct values in first-seen order).

    Why: a diff codes the same columns of both profiles; ``column_codes`` has
    each side's codes from its file's index columns, so only the distinct
    values (thousands, not millions) are looked up here. The values are met in
    the order ``paired_codes`` meets them over ``[*a, *b]``: ``a``'s first-seen
    order, then ``b``'s values that ``a`` lacks.
    """
    (found_a, values_a), (found_b, values_b) = a, b
    merged = dict.fromkeys(values_a)
    if len(merged) != len(values_a):  # values that are not distinct: coded again here, in order
        return paired_codes([values_a[i] for i in found_a.tolist()], [values_b[i] for i in found_b.tolist()])
    merged.update(dict.fromkeys(values_b))  # b's values that a lacks, after a's (dict loops in C)
    position = dict(zip(merged, itertools.count()))
    lut_b = np.fromiter(map(position.__getitem__, values_b), dtype=np.intp, count=len(values_b))
    return found_a.copy(), lut_b[found_b], list(merged)


def column_codes(frame: NodeFrame, name: str) -> tuple[np.ndarray, list[object]]:
    """``codes`` of a frame column, once per profile (read-only).

    A column that every graph's file stores as indices into a table (text,
    shapes, dtypes) is coded from those indices: the same codes and values,
    without a pass over the column's values.
    """
    def build() -> tuple[np.ndarray, list[object]]:
        tables = [graph_indexed(g, name) for g in frame.graphs] if name in CODED_COLUMNS else [None]
        if None in tables:
            found, values = codes(frame.column(name))
        else:
            found, values = _codes_of_indices(tables)  # type: ignore[arg-type]
        found.flags.writeable = False
        return found, values
    return frame.memo(("codes", name), build)


#: Frame columns a loaded file may store as indices into a table (``NodeColumns.indexed``): their
#: codes cost no pass over their values.
CODED_COLUMNS = frozenset(("op", "type", "module", "module_type", "source", "phase", "scope",
                      "in_shapes", "out_shapes", "in_dtypes", "out_dtypes"))


def _codes_of_indices(tables: list[tuple[list[Any], np.ndarray]]) -> tuple[np.ndarray, list[Any]]:
    """``codes`` of the concatenated columns given as (table, index per node): each table entry a node
    uses is coded once, in order of the first node that uses it (equal entries share a code)."""
    if len(tables) == 1:
        distinct = _distinct_codes(*tables[0])
        if distinct is not None:
            return distinct
    index: dict[Any, int] = {}
    parts = []
    for table, idx in tables:
        lut = np.zeros(len(table), dtype=np.intp)
        for t in _used_by_first_use(table, idx).tolist():
            lut[t] = index.setdefault(table[t], len(index))
        parts.append(lut[idx])
    found = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=np.intp)
    return found, list(index)


def _distinct_codes(table: list[Any], idx: np.ndarray) -> tuple[np.ndarray, list[Any]] | None:
    """``_codes_of_indices`` of one table whose used entries all differ (a file's tables do): the codes
    number the used entries by their first node, all in numpy; None when two used entries are equal."""
    used = _used_by_first_use(table, idx)
    values = [table[t] for t in used.tolist()]
    if len(set(values)) != len(values):
        return None
    lut = np.zeros(len(table), dtype=np.intp)
    lut[used] = np.arange(len(used), dtype=np.intp)
    return lut[idx], values


def _used_by_first_use(table: list[Any], idx: np.ndarray) -> np.ndarray:
    """The positions in ``table`` that ``idx`` (one per node) uses, in order of the first node using each.

    Not ``used_entries`` (which entries, ascending): the pass that finds each entry's first node says
    which entries are used as well.
    """
    n = len(idx)
    first = np.full(len(table), n, dtype=np.intp)
    np.minimum.at(first, idx, np.arange(n, dtype=np.intp))
    used = np.flatnonzero(first < n)
    return used[np.argsort(first[used], kind="stable")]


def column_mask(frame: NodeFrame, name: str, test: Callable[[Any], bool]) -> np.ndarray:
    """Where ``test(value)`` holds for a column, judged once per distinct value."""
    found, values = column_codes(frame, name)
    if not values:
        return np.zeros(len(found), dtype=bool)
    return np.array([bool(test(v)) for v in values], dtype=bool)[found]


def graph_spans(profile: Profile, frame: NodeFrame) -> list[tuple[int, int]]:
    """(start, end) of each graph of ``profile.graphs`` in the frame's flat columns (``frame.spans``)."""
    return frame.spans()
