"""A loaded graph's node columns: validated at load, turned into values or NodeRecords only when asked.

Why: building one NodeRecord (and one MemoryRecord) per node was most of a
profile's load, and ``graphprof analyze`` reads a dozen of the 23 fields. The
loader (``graphprof.profile.columns``) validates every column of the file and
hands the graph a NodeColumns instead of records: ``column(field)`` gives one
field for every node (a list, computed once), ``samples_ns(field)`` the time
samples as one int64 array of steps x nodes, and ``node_records()`` builds the
records, exactly those the eager loader built, when someone reads
``graph.nodes``.

What is kept is compact: index columns stay the file's small integers beside
their tables (strings, shape and dtype sets), time samples and input edges are
int64 arrays, and the rest are the validated JSON lists themselves.
"""

from __future__ import annotations

import gc
import itertools
from contextlib import contextmanager
from dataclasses import fields
from typing import Any, Iterator, Sequence

import numpy as np

from graphprof.profile.records import MemoryRecord, NodeRecord, NodeSource

_new = object.__new__
NODE_FIELDS = tuple(f.name for f in fields(NodeRecord))
MEMORY_FIELDS = tuple(f.name for f in fields(MemoryRecord))
TIME_FIELDS = ("host_time_ns", "device_time_ns")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a profile is parsed or its records are built.

    Why: parsing and building a 100,000-node profile allocates millions of
    objects and none of them form cycles, yet each allocation burst triggers a
    full collection; pausing it makes loading about twice as fast.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_all(cls: type, names: tuple[str, ...], rows: Any) -> list[Any]:
    """Instances of the frozen dataclass ``cls`` from validated field values, without its __init__.

    Why: building 100,000 records through a frozen dataclass's __init__ (one
    ``object.__setattr__`` per field) is a third of their building time.
    A class with a ``__post_init__`` goes through __init__, so no check is skipped.
    """
    if hasattr(cls, "__post_init__"):
        return [cls(*row) for row in rows]
    out: list[Any] = []
    append = out.append
    for row in rows:
        obj: Any = _new(cls)
        obj.__dict__.update(zip(names, row))
        append(obj)
    return out


def flat_rows(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of integers (each node's input ids) as one int64 array and where each row starts in it
    (``len(rows) + 1`` offsets): the shape of a file's input edges, for rows given as tuples."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(offsets[-1])), offsets


def used_entries(table: Sequence[Any], index: np.ndarray) -> np.ndarray:
    """The positions in ``table`` that ``index`` (one per node) refers to, ascending: the entries of a
    stored table the nodes use, for a reader that judges or writes each entry once."""
    return np.flatnonzero(np.bincount(index, minlength=len(table)))


class Column:
    """One field of every node, as the file holds it: ``values()`` makes the list, ``at(i)`` one node's value."""

    __slots__ = ()

    def values(self) -> list[Any]:
        raise NotImplementedError

    def at(self, i: int) -> Any:
        raise NotImplementedError


class Kept(Column):
    """A column whose validated list is already each node's value; ``ints``: the same values as an
    int64 array, for a column of integers that the loader converted while checking them (else None)."""

    __slots__ = ("data", "ints")

    def __init__(self, data: list[Any], ints: np.ndarray | None = None) -> None:
        self.data = data
        self.ints = ints
        if ints is not None:
            ints.flags.writeable = False  # shared by every reader

    def values(self) -> list[Any]:
        return self.data

    def at(self, i: int) -> Any:
        return self.data[i]


class Repeated(Column):
    """One value for every node (a field the file leaves out)."""

    __slots__ = ("value", "size")

    def __init__(self, value: Any, size: int) -> None:
        self.value, self.size = value, size

    def values(self) -> list[Any]:
        return [self.value] * self.size

    def at(self, i: int) -> Any:
        return self.value


class Positions(Column):
    """Each node's position (the ids of a file that leaves them out: 0..N-1)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def values(self) -> list[Any]:
        return list(range(self.size))

    def at(self, i: int) -> Any:
        return i


class Indexed(Column):
    """Indices into a table (strings, shape sets, dtype sets): the value is the table's entry."""

    __slots__ = ("table", "index")

    def __init__(self, table: list[Any], index: np.ndarray) -> None:
        self.table, self.index = table, index

    def values(self) -> list[Any]:
        entries = np.fromiter(self.table, dtype=object, count=len(self.table))  # tuples stay whole entries
        return entries[self.index].tolist()  # type: ignore[no-any-return]

    def at(self, i: int) -> Any:
        return self.table[int(self.index[i])]


class Flags(Column):
    """0/1 (or null) flags read as bools (None stays None)."""

    __slots__ = ("data",)

    def __init__(self, data: list[Any]) -> None:
        self.data = data

    def values(self) -> list[Any]:
        return [None if v is None else bool(v) for v in self.data]

    def at(self, i: int) -> Any:
        v = self.data[i]
        return None if v is None else bool(v)


class Edges(Column):
    """Input edges: every input id in one int64 array and where each node's inputs start."""

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets

    def values(self) -> list[Any]:
        flat, bounds = self.ids.tolist(), self.offsets.tolist()
        return [tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:])]

    def at(self, i: int) -> Any:
        return tuple(self.ids[self.offsets[i]:self.offsets[i + 1]].tolist())


class Samples(Column):
    """Time samples in ns: an int64 array of steps x nodes, or one tuple per node (ragged files)."""

    __slots__ = ("data", "size")

    def __init__(self, data: np.ndarray | list[tuple[int, ...]], size: int) -> None:
        self.data, self.size = data, size

    def values(self) -> list[Any]:
        data = self.data
        if isinstance(data, list):
            return data
        if data.shape[0] == 0:
            return [()] * self.size
        return list(map(tuple, data.T.tolist()))

    def at(self, i: int) -> Any:
        data = self.data
        return data[i] if isinstance(data, list) else tuple(data[:, i].tolist())


class SparseMaps(Column):
    """A mapping field (bytes per category): one row of values per node over shared keys, or null.

    Mappings are sparse: a key a node does not have is written as 0 in the
    table and dropped again here, so save/load changes nothing.
    """

    __slots__ = ("keys", "rows")

    def __init__(self, keys: list[str], rows: list[list[int] | None]) -> None:
        self.keys, self.rows = keys, rows

    def values(self) -> list[Any]:
        keys = self.keys
        return [{k: x for k, x in zip(keys, v) if x} if v is not None else None for v in self.rows]

    def at(self, i: int) -> Any:
        v = self.rows[i]
        return {k: x for k, x in zip(self.keys, v) if x} if v is not None else None


class MemoryColumns(Column):
    """The validated ``memory`` column of a graph: one list per MemoryRecord field and who has a record.

    ``per_field`` holds, per field present in the file, its column
    (ints or None for a plain field; a dict or None for a mapping field);
    ``present`` says which nodes have a record; ``present_from`` names the
    plain field ``present`` was read from (its None values are the absent records), if any.
    """

    __slots__ = ("per_field", "present", "present_from", "defaults")

    def __init__(self, per_field: dict[str, Column], present: list[bool], present_from: str | None,
                 defaults: dict[str, Any]) -> None:
        self.per_field = per_field
        self.present = present
        self.present_from = present_from
        self.defaults = defaults

    def field_values(self, name: str) -> list[Any]:
        """``record.name`` for every node, None where the node has no record."""
        if name == self.present_from:
            return self.per_field[name].values()
        default = self.defaults[name]
        col = self.per_field.get(name)
        if col is None:
            return [default if has else None for has in self.present]
        if isinstance(col, Kept) and col.ints is not None and all(self.present):
            return col.values()  # no null and every node a record: the values as they are
        return [(default if v is None else v) if has else None for has, v in zip(self.present, col.values())]

    def values(self) -> list[Any]:
        return self.records()

    def int_field(self, name: str) -> np.ndarray | None:
        """``field_values(name)`` as the loader's int64 array, when every node has a record and an int there."""
        column = self.per_field.get(name)
        if not isinstance(column, Kept) or column.ints is None:
            return None
        if name != self.present_from and not all(self.present):  # the present_from field has no null: all present
            return None
        return column.ints

    def at(self, i: int) -> Any:
        if not self.present[i]:
            return None
        row = [self.per_field[k].at(i) if k in self.per_field else self.defaults[k] for k in MEMORY_FIELDS]
        return build_all(MemoryRecord, MEMORY_FIELDS,
                         [tuple(self.defaults[k] if v is None else v for k, v in zip(MEMORY_FIELDS, row))])[0]

    def records(self) -> list[MemoryRecord | None]:
        columns = [self.per_field[k].values() if k in self.per_field else itertools.repeat(self.defaults[k])
                   for k in MEMORY_FIELDS]
        defaults = [self.defaults[k] for k in MEMORY_FIELDS]
        rows = [row if None not in row else tuple(d if v is None else v for v, d in zip(row, defaults))
                for has, row in zip(self.present, zip(*columns)) if has]
        records = iter(build_all(MemoryRecord, MEMORY_FIELDS, rows))
        return [next(records) if has else None for has in self.present]


class NodeColumns(NodeSource):
    """Every field of a loaded graph's nodes, as columns; see the module docstring."""

    __slots__ = ("size", "_columns", "_cache", "memory")

    def __init__(self, size: int, columns: dict[str, Column], memory: MemoryColumns | None,
                 defaults: dict[str, Any]) -> None:
        self.size = size
        self._columns = columns
        self._cache: dict[str, list[Any]] = {}
        self.memory = memory
        if memory is not None:
            columns["memory"] = memory
        for name in NODE_FIELDS:
            if name not in columns:
                columns[name] = Repeated(defaults[name], size)

    def column(self, name: str) -> list[Any]:
        """The NodeRecord field ``name`` of every node, in order (computed once; shared, do not modify)."""
        cached = self._cache.get(name)
        if cached is None:
            cached = self._cache[name] = self._columns[name].values()
        return cached

    def phase_values(self) -> list[str]:
        """Each node's phase as its text value (without making the Phase column)."""
        if "phase_value" in self._columns:
            return self.column("phase_value")
        return [p.value for p in self.column("phase")]

    def samples_ns(self, name: str) -> np.ndarray | None:
        """The samples of time field ``name`` as an int64 array of steps x nodes, or None when nodes
        hold different numbers of samples (files that store them per node)."""
        column = self._columns[name]
        if isinstance(column, Samples):
            return column.data if isinstance(column.data, np.ndarray) else None
        return np.zeros((0, self.size), dtype=np.int64)

    def indexed(self, name: str) -> tuple[list[Any], np.ndarray] | None:
        """Field ``name`` as the file stores it: a table of values and each node's index into it (an
        intp array), or None when it is not stored so. ``phase`` gives the phases' text values.

        Why: grouping nodes by a text column needs a code per node, and these
        indices are such codes already, without a list of a million strings.
        """
        if name == "phase":
            if "phase_value" in self._columns:
                name = "phase_value"
            else:
                phase = self._columns["phase"]
                return ([phase.value.value], np.zeros(self.size, dtype=np.intp)) if isinstance(phase, Repeated) else None
        column = self._columns.get(name)
        if isinstance(column, Indexed):
            return column.table, column.index
        if isinstance(column, Repeated):
            return [column.value], np.zeros(self.size, dtype=np.intp)
        return None

    def input_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every node's input ids in one int64 array, and where each node's start (``size + 1`` offsets):
        the ``inputs`` column without making one tuple per node."""
        column = self._columns["inputs"]
        if isinstance(column, Edges):
            return column.ids, column.offsets
        return flat_rows(column.values())  # no inputs column (every node has none), or one a caller built

    def int_column(self, name: str) -> np.ndarray | None:
        """Integer field ``name`` (a NodeRecord field, or a memory record's) of every node as the int64
        array the loader checked it as; None unless every node has an integer there (then read ``column``
        or ``memory_field``). Read-only."""
        if name in MEMORY_FIELDS:
            return self.memory.int_field(name) if self.memory is not None else None
        column = self._columns.get(name)
        return column.ints if isinstance(column, Kept) else None

    def memory_field(self, name: str) -> list[Any]:
        """``node.memory.name`` for every node, None where a node has no memory record."""
        if self.memory is None:
            return [None] * self.size
        return self.memory.field_values(name)

    def record(self, i: int) -> NodeRecord:
        """Node ``i``'s record alone (for the few nodes a table shows), equal to ``node_records()[i]``."""
        cells = [self._cache[name][i] if name in self._cache else self._columns[name].at(i) for name in NODE_FIELDS]
        return build_all(NodeRecord, NODE_FIELDS, [cells])[0]  # type: ignore[no-any-return]

    def node_records(self) -> tuple[NodeRecord, ...]:
        with gc_paused():
            columns = [self.column(name) for name in NODE_FIELDS]
            return tuple(build_all(NodeRecord, NODE_FIELDS, zip(*columns)))

    def __reduce__(self) -> Any:
        # A pickled (or deep-copied) graph carries its records, not the file's columns.
        return (BuiltRecords, (self.node_records(),))


class BuiltRecords(NodeSource):
    """A NodeSource of records already built (what a NodeColumns becomes when pickled or copied)."""

    __slots__ = ("size", "records")

    def __init__(self, records: tuple[NodeRecord, ...]) -> None:
        self.size = len(records)
        self.records = records

    def node_records(self) -> tuple[NodeRecord, ...]:
        return self.records
