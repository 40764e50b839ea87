"""A graph's memory records as arrays over the nodes that have one, read once for every memory view.

Why: the memory summary and timeline of a 100,000-node graph read six
memory fields of every node. Read through ``graph_column`` each field was a
Python list built node by node, and the live bytes by category one dict per
node; building those lists (twice in an HTML report) was most of the memory
timeline's cost. A loaded graph holds its memory fields as the file's
validated columns (``profile.node_columns.MemoryColumns``), so here they are
taken at the nodes with a record as whole arrays, categories as one matrix.
A graph with built records (a profile made in memory) is read from its
records as before; both give the same values.

Arrays are int64 when no sum a view takes can leave int64, else Python ints
in object arrays, so every figure equals the Python arithmetic it replaces.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from graphprof.analysis.frame import graph_column
from graphprof.profile.model import GraphRecord
from graphprof.profile.node_columns import Kept, MemoryColumns, NodeColumns, SparseMaps
from graphprof.profile.records import node_source

#: The plain (integer) memory fields a view reads.
INT_FIELDS = ("allocated_bytes", "freed_bytes", "live_bytes", "workspace_bytes", "workspace_allocated_bytes")
#: Largest magnitude for which int64 arrays are used: sums of up to 64 such values stay in int64.
_SAFE_MAGNITUDE = 2**56


@dataclass(frozen=True)
class GraphMemory:
    """The memory fields of the nodes of one graph that have a memory record, in execution order.

    ``kept`` are those nodes' positions in the graph; ``fields[name]`` the
    integer field ``name`` at them; ``by_category[c]`` the live bytes of
    category ``c`` at them (0 where a node has none), for every category some
    node names, in the order first named.
    """

    kept: Sequence[int]
    fields: dict[str, np.ndarray]
    by_category: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.kept)

    def pick(self, column: Sequence[Any]) -> list[Any]:
        """``column`` (one value per node of the graph) at the kept nodes."""
        if len(self.kept) == len(column):
            return list(column)
        return [column[i] for i in self.kept]


def _array(values: Sequence[Any], checked: bool = True) -> np.ndarray:
    """``values`` as int64, or as they are in an object array when one is too large for int64 sums or
    is no int (``checked``: the loader validated them as ints)."""
    if not checked and not set(map(type, values)) <= {int}:
        return np.array(list(values), dtype=object)
    try:
        out = np.fromiter(values, dtype=np.int64, count=len(values))
    except (OverflowError, TypeError, ValueError):
        return np.array(list(values), dtype=object)
    if not _safe(out):
        return np.array(list(values), dtype=object)
    return out


def _picker(kept: list[int], size: int) -> Any:
    if len(kept) == size:
        return list
    if not kept:
        return lambda column: []
    get = operator.itemgetter(*kept)
    return (lambda column: [get(column)]) if len(kept) == 1 else (lambda column: list(get(column)))


def _safe(values: np.ndarray) -> bool:
    """Whether int64 ``values`` stay below ``_SAFE_MAGNITUDE`` (so their sums cannot leave int64)."""
    return not values.size or max(-int(values.min()), int(values.max())) < _SAFE_MAGNITUDE


def _kept_ints(column: Kept, kept: list[int], pick: Any, default: Any) -> np.ndarray:
    """A loaded memory field at the ``kept`` nodes, as ``_array`` makes it. The loader's int64 array
    (``Kept.ints``, made when the field has no null) is taken as it is where its magnitudes are safe:
    converting the list again was most of reading the field."""
    ints = column.ints
    if ints is not None:
        picked = ints if len(kept) == len(ints) else ints[np.asarray(kept, dtype=np.intp)]
        if _safe(picked):
            return picked
    values = pick(column.data)
    return _array([default if v is None else v for v in values] if None in values else values)


def _loaded(memory: MemoryColumns, size: int) -> GraphMemory | None:
    """From a loaded graph's memory columns; None where their layout needs the record path."""
    kept = [i for i, has in enumerate(memory.present) if has] if not all(memory.present) else list(range(size))
    pick = _picker(kept, size)
    fields: dict[str, np.ndarray] = {}
    for name in INT_FIELDS:
        column, default = memory.per_field.get(name), memory.defaults[name]
        if column is None:
            fields[name] = _array([default] * len(kept))
            continue
        if not isinstance(column, Kept) or default is None:
            return None
        fields[name] = _kept_ints(column, kept, pick, default)
    maps = memory.per_field.get("live_by_category_bytes")
    if maps is None:
        return GraphMemory(kept, fields, {})
    if not isinstance(maps, SparseMaps) or len(set(maps.keys)) != len(maps.keys):
        return None  # repeated keys: a later non-zero value overrides an earlier one, as the records have it
    rows = pick(maps.rows)
    if None in rows:
        empty = [0] * len(maps.keys)
        rows = [empty if r is None else r for r in rows]
    flat = list(itertools.chain.from_iterable(rows))  # one pass: far cheaper than numpy reading nested lists
    if len(flat) != len(kept) * len(maps.keys):
        return None
    matrix = _array(flat).reshape(len(kept), len(maps.keys))
    return GraphMemory(kept, fields, {k: matrix[:, j] for j, k in enumerate(maps.keys)})


def _from_records(graph: GraphRecord) -> GraphMemory:
    live = graph_column(graph, "live_bytes")
    kept = [i for i, v in enumerate(live) if v is not None]  # nodes with a memory record
    pick = _picker(kept, len(live))
    fields = {name: _array(pick(graph_column(graph, name)), checked=False) for name in INT_FIELDS}
    maps = pick(graph_column(graph, "live_by_category_bytes"))
    names = list(dict.fromkeys(c for cats in maps for c in cats))
    by_category = {c: _array([int(cats.get(c, 0)) for cats in maps], checked=False) for c in names}
    return GraphMemory(kept, fields, by_category)


def graph_memory(graph: GraphRecord) -> GraphMemory:
    """The memory fields of ``graph``'s nodes that have a memory record (none: an empty ``kept``)."""
    source = node_source(graph)
    if isinstance(source, NodeColumns):
        if source.memory is None:
            return GraphMemory([], {name: _array([]) for name in INT_FIELDS}, {})
        loaded = _loaded(source.memory, source.size)
        if loaded is not None:
            return loaded
    return _from_records(graph)


def has_memory_records(graphs: Sequence[GraphRecord]) -> bool:
    """Whether any node of ``graphs`` has a memory record, without reading the records' fields."""
    for graph in graphs:
        source = node_source(graph)
        if isinstance(source, NodeColumns):
            if source.memory is not None and any(source.memory.present):
                return True
        elif any(v is not None for v in graph_column(graph, "live_by_category_bytes")):
            return True
    return False


def last_index(values: Sequence[Any], value: Any) -> int | None:
    """Position of the last ``value`` in ``values`` (what a dict from value to position would give), or None."""
    if value not in values:
        return None
    return len(values) - 1 - list(values)[::-1].index(value)
