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
from typing import Any, Callable, Iterator

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


class MemoryColumns:
    """The validated ``memory`` column of a graph: one list per MemoryRecord field and who has a record.

    ``per_field`` holds, per field present in the file, a list over nodes
    (ints or None for a plain field; a dict or None for a mapping field);
    ``present`` says which nodes have a record; ``present_from`` names the
    plain field ``present`` was read from (its None values are the absent records), if any.
    """

    __slots__ = ("per_field", "present", "present_from", "defaults")

    def __init__(self, per_field: dict[str, list[Any]], present: list[bool], present_from: str | None,
                 defaults: dict[str, Any]) -> None:
        self.per_field = per_field
        self.present = present
        self.present_from = present_from
        self.defaults = defaults

    def field_values(self, name: str) -> list[Any]:
        """``record.name`` for every node, None where the node has no record."""
        if name == self.present_from:
            return self.per_field[name]
        default = self.defaults[name]
        col = self.per_field.get(name)
        if col is None:
            return [default if has else None for has in self.present]
        return [(default if v is None else v) if has else None for has, v in zip(self.present, col)]

    def records(self) -> list[MemoryRecord | None]:
        columns = [self.per_field[k] if k in self.per_field else itertools.repeat(self.defaults[k])
                   for k in MEMORY_FIELDS]
        defaults = [self.defaults[k] for k in MEMORY_FIELDS]
        rows = [row if None not in row else tuple(d if v is None else v for v, d in zip(row, defaults))
                for has, row in zip(self.present, zip(*columns)) if has]
        records = iter(build_all(MemoryRecord, MEMORY_FIELDS, rows))
        return [next(records) if has else None for has in self.present]


class NodeColumns(NodeSource):
    """Every field of a loaded graph's nodes, as columns; see the module docstring."""

    __slots__ = ("size", "_makers", "_cache", "memory", "_samples")

    def __init__(self, size: int, makers: dict[str, Callable[[], list[Any]]], memory: MemoryColumns | None,
                 samples: dict[str, np.ndarray | list[tuple[int, ...]]], defaults: dict[str, Any]) -> None:
        self.size = size
        self._makers = makers
        self._cache: dict[str, list[Any]] = {}
        self.memory = memory
        self._samples = samples
        for name in NODE_FIELDS:
            if name not in makers and name not in samples and not (name == "memory" and memory is not None):
                self._makers[name] = _repeat(defaults[name], size)

    def column(self, name: str) -> list[Any]:
        """The NodeRecord field ``name`` of every node, in order (computed once; shared, do not modify)."""
        cached = self._cache.get(name)
        if cached is None:
            if name in self._samples:
                cached = _sample_tuples(self._samples[name], self.size)
            elif name == "memory" and self.memory is not None:
                cached = self.memory.records()  # type: ignore[assignment]
            else:
                cached = self._makers[name]()
            self._cache[name] = cached
        return cached

    def phase_values(self) -> list[str]:
        """Each node's phase as its text value (without making the Phase column)."""
        if "phase_value" in self._makers:
            cached = self._cache.get("phase_value")
            if cached is None:
                cached = self._cache["phase_value"] = self._makers["phase_value"]()
            return cached
        return [p.value for p in self.column("phase")]

    def samples_ns(self, name: str) -> np.ndarray | None:
        """The samples of time field ``name`` as an int64 array of steps x nodes, or None when nodes
        hold different numbers of samples (files that store them per node)."""
        samples = self._samples.get(name)
        if samples is None:
            return np.zeros((0, self.size), dtype=np.int64)
        return samples if isinstance(samples, np.ndarray) else None

    def memory_field(self, name: str) -> list[Any]:
        """``node.memory.name`` for every node, None where a node has no memory record."""
        if self.memory is None:
            return [None] * self.size
        return self.memory.field_values(name)

    def node_records(self) -> tuple[NodeRecord, ...]:
        with gc_paused():
            columns = [self.column(name) for name in NODE_FIELDS]
            return tuple(build_all(NodeRecord, NODE_FIELDS, zip(*columns)))

    def __reduce__(self) -> Any:
        # Its makers are closures, which do not pickle: a pickled (or deep-copied) graph carries its records.
        return (BuiltRecords, (self.node_records(),))


class BuiltRecords(NodeSource):
    """A NodeSource of records already built (what a NodeColumns becomes when pickled or copied)."""

    __slots__ = ("size", "records")

    def __init__(self, records: tuple[NodeRecord, ...]) -> None:
        self.size = len(records)
        self.records = records

    def node_records(self) -> tuple[NodeRecord, ...]:
        return self.records


def _repeat(value: Any, n: int) -> Callable[[], list[Any]]:
    return lambda: [value] * n


def _sample_tuples(samples: np.ndarray | list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    if isinstance(samples, list):
        return samples
    if samples.shape[0] == 0:
        return [()] * n
    return list(map(tuple, samples.T.tolist()))
