"""A profile's nodes as flat columns, computed once per profile and shared by every analysis.

Why: ``graphprof report`` builds five tables, a roofline, the critical paths
and the advisor's findings from one profile. Each used to walk every node
again (flatten the graphs, take each node's median, read each attribute
through an entry object); on a 100,000-node profile that repeated walking
was most of the command's time. Here each walk happens once: each node's
time under a statistic and clock, and any column (one Python list per
attribute, in execution order) are computed on first use and kept while the
profile lives.

A loaded profile's graphs hold their file's validated columns
(``graphprof.profile.node_columns``), and the frame reads those: a column or
the nodes' times never need a NodeRecord, so a view that reads columns never
pays for building them. ``pairs`` (every (graph, node) as records) is built
only when read. A profile built in memory (at trace time) has records, and
the frame reads them as before: both give the same values.

Index i of every column is the node's position in execution order over all graphs.

The cache is keyed by the profile object's identity and dropped with it
(a weak reference): a Profile is immutable, so nothing it derives can go stale.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

import numpy as np

from graphprof.analysis.node_time import graph_times_s
from graphprof.profile.model import GraphRecord, NodeRecord, Profile, graph_size, node_source
from graphprof.profile.node_columns import NodeColumns, flat_rows
from graphprof.profile.schema import INT64_MAX

NodePairs = list[tuple[GraphRecord, NodeRecord]]


def _memory_field(name: str) -> Callable[[NodeRecord], Any]:
    def read(node: NodeRecord) -> Any:
        memory = node.memory
        return None if memory is None else getattr(memory, name)
    return read


def _moved(node: NodeRecord) -> Any:
    read, written = node.bytes_read, node.bytes_written
    if read is None:
        return written
    if written is None:
        return read
    return read + written


def _moved_column(read: list[Any], written: list[Any]) -> list[Any]:
    return [w if r is None else r if w is None else r + w for r, w in zip(read, written)]


def moved_ints(columns: NodeColumns) -> np.ndarray | None:
    """A loaded graph's bytes moved (read + written) as one int64 array sum, where both columns are the
    loader's int64 arrays and no sum leaves int64 (they are counts, so the largest sum is the sum of the
    largest); None otherwise (then ``_moved_column`` adds them in Python)."""
    read, written = columns.int_column("bytes_read"), columns.int_column("bytes_written")
    if read is None or written is None or (len(read) and int(read.max()) + int(written.max()) > INT64_MAX):
        return None
    return read + written


def _moved_of_columns(columns: NodeColumns) -> list[Any]:
    """``_moved_column`` of a loaded graph, from ``moved_ints`` where it can."""
    moved = moved_ints(columns)
    if moved is not None:
        return moved.tolist()  # type: ignore[no-any-return]
    return _moved_column(columns.column("bytes_read"), columns.column("bytes_written"))


#: Columns that are not a plain NodeRecord attribute: how to read them from a node (records),
#: and how to make them from a loaded graph's columns.
_DERIVED: dict[str, Callable[[NodeRecord], Any]] = {
    "phase": lambda n: n.phase.value,
    "bytes_moved": _moved,
    "allocated_bytes": _memory_field("allocated_bytes"),
    "freed_bytes": _memory_field("freed_bytes"),
    "live_bytes": _memory_field("live_bytes"),
    "live_by_category_bytes": _memory_field("live_by_category_bytes"),
    "workspace_bytes": _memory_field("workspace_bytes"),
    "workspace_allocated_bytes": _memory_field("workspace_allocated_bytes"),
}
_DERIVED_FROM_COLUMNS: dict[str, Callable[[NodeColumns], list[Any]]] = {
    "phase": NodeColumns.phase_values,
    "bytes_moved": lambda c: _moved_of_columns(c),
    "allocated_bytes": lambda c: c.memory_field("allocated_bytes"),
    "freed_bytes": lambda c: c.memory_field("freed_bytes"),
    "live_bytes": lambda c: c.memory_field("live_bytes"),
    "live_by_category_bytes": lambda c: c.memory_field("live_by_category_bytes"),
    "workspace_bytes": lambda c: c.memory_field("workspace_bytes"),
    "workspace_allocated_bytes": lambda c: c.memory_field("workspace_allocated_bytes"),
}
#: Columns with one value per graph, repeated over its nodes.
_PER_GRAPH: dict[str, Callable[[int, GraphRecord], Any]] = {
    "graph": lambda i, g: g.name,
    "graph_index": lambda i, g: i,
    "graph_id": lambda i, g: g.id,
}


class NodeFrame:
    """Every node of one profile in execution order, with cached per-node columns."""

    __slots__ = ("graphs", "sizes", "_pairs", "_times", "_columns", "_arrays", "_memo", "__weakref__")

    def __init__(self, profile: Profile) -> None:
        self.graphs = profile.graphs
        #: Nodes per graph, in the order of ``graphs``.
        self.sizes = [graph_size(g) for g in self.graphs]
        self._pairs: NodePairs | None = None
        self._times: dict[tuple[str, str], list[float]] = {}
        self._columns: dict[str, list[Any]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._memo: dict[Any, Any] = {}

    def __len__(self) -> int:
        return sum(self.sizes)

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) of each graph's nodes in the columns, in the order of ``graphs``."""
        ends = list(itertools.accumulate(self.sizes))
        return [(end - size, end) for size, end in zip(self.sizes, ends)]

    @property
    def pairs(self) -> NodePairs:
        """Every (graph, node record) in execution order; builds the records (prefer ``column``/``times``)."""
        if self._pairs is None:
            self._pairs = [(g, n) for g in self.graphs for n in g.nodes]
        return self._pairs

    def pair(self, i: int) -> tuple[GraphRecord, NodeRecord]:
        """The (graph, node record) of node ``i``: for the few nodes a view shows (builds that graph's records)."""
        if self._pairs is not None:
            return self._pairs[i]
        for graph, size in zip(self.graphs, self.sizes):
            if i < size:
                return graph, graph_record(graph, i)
            i -= size
        raise IndexError("node index out of range")

    def times(self, stat: str, clock: str) -> list[float]:
        """Each node's ``node_time_s`` under ``stat`` on ``clock`` (``auto``, ``host`` or ``device``)."""
        key = (stat, clock)
        cached = self._times.get(key)
        if cached is None:
            cached = self._times[key] = self._joined([graph_times_s(g, stat, clock) for g in self.graphs])
        return cached

    def column(self, name: str) -> list[Any]:
        """The value of ``name`` for every node: a NodeRecord field or a derived column.

        Derived: ``graph`` (the graph's name), ``graph_index`` (the graph's
        position in ``profile.graphs``), ``graph_id``, ``phase`` (its text
        value), ``bytes_moved``, and the memory record's ``allocated_bytes``,
        ``freed_bytes``, ``live_bytes``, ``live_by_category_bytes``,
        ``workspace_bytes`` and ``workspace_allocated_bytes`` (None where a node has no record). Shared: do not modify.
        """
        cached = self._columns.get(name)
        if cached is None:
            if name in _PER_GRAPH:
                value = _PER_GRAPH[name]
                cached = []
                for i, (graph, size) in enumerate(zip(self.graphs, self.sizes)):
                    cached += [value(i, graph)] * size
            else:
                cached = self._joined([graph_column(g, name) for g in self.graphs])
            self._columns[name] = cached
        return cached

    def array(self, name: str) -> np.ndarray:
        """A numeric column as a numpy array (int64 for integers; float64 with NaN where a value is None)."""
        cached = self._arrays.get(name)
        if cached is None:
            values = self.column(name)
            if None in values:
                cached = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            else:
                cached = np.array(values)
            self._arrays[name] = cached
        return cached

    def sampled(self, name: str) -> np.ndarray:
        """Whether each node has samples in time field ``name`` (``bool(node.<name>)``), as a bool array.

        Why not the column: it is one tuple per node, and a file that keeps
        every node's samples in one array answers this for all its nodes at once.
        """
        def build() -> np.ndarray:
            parts = []
            for graph, size in zip(self.graphs, self.sizes):
                source = node_source(graph)
                samples = source.samples_ns(name) if isinstance(source, NodeColumns) else None
                if samples is not None:
                    parts.append(np.full(size, samples.shape[0] > 0, dtype=bool))
                else:
                    parts.append(np.array(list(map(bool, graph_column(graph, name))), dtype=bool).reshape(size))
            out = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
            out.flags.writeable = False
            return out
        return self.memo(("sampled", name), build)  # type: ignore[no-any-return]

    def input_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``inputs`` column as arrays: every node's input ids in one int64 array, and where each
        node's start in it (``len(self) + 1`` offsets). A loaded graph's are its file's edge arrays."""
        def build() -> tuple[np.ndarray, np.ndarray]:
            parts = [graph_input_arrays(g) for g in self.graphs]
            if len(parts) == 1:
                return parts[0]
            shifts = np.cumsum([0] + [len(flat) for flat, _ in parts[:-1]])
            offsets = np.concatenate([[0]] + [off[1:] + shift for (_, off), shift in zip(parts, shifts)])
            flat = np.concatenate([flat for flat, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
            return flat, offsets.astype(np.int64)
        return self.memo("input_arrays", build)  # type: ignore[no-any-return]

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, computed once per ``key`` for this profile (for results of pure analyses)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @staticmethod
    def _joined(parts: list[list[Any]]) -> list[Any]:
        if len(parts) == 1:
            return parts[0]
        out: list[Any] = []
        for part in parts:
            out += part
        return out


def graph_column(graph: GraphRecord, name: str) -> list[Any]:
    """Column ``name`` of one graph: from its loaded columns when it has them, else from its records."""
    source = node_source(graph)
    if isinstance(source, NodeColumns):
        derive = _DERIVED_FROM_COLUMNS.get(name)
        return derive(source) if derive is not None else source.column(name)
    if name in _DERIVED:
        read = _DERIVED[name]
        return [read(n) for n in graph.nodes]
    return [getattr(n, name) for n in graph.nodes]


def graph_input_arrays(graph: GraphRecord) -> tuple[np.ndarray, np.ndarray]:
    """``NodeColumns.input_arrays`` of one graph, from its records when it has no loaded columns."""
    source = node_source(graph)
    if isinstance(source, NodeColumns):
        return source.input_arrays()
    return flat_rows([n.inputs for n in graph.nodes])


def graph_indexed(graph: GraphRecord, name: str) -> tuple[list[Any], np.ndarray] | None:
    """``NodeColumns.indexed`` of one graph; None for a graph without loaded columns."""
    source = node_source(graph)
    return source.indexed(name) if isinstance(source, NodeColumns) else None


def graph_record(graph: GraphRecord, i: int) -> NodeRecord:
    """Node ``i`` of ``graph`` as a record, equal to ``graph.nodes[i]``, without building the graph's others."""
    source = node_source(graph)
    if isinstance(source, NodeColumns):
        return source.record(i)
    return graph.nodes[i]


_FRAMES: dict[int, tuple[weakref.ref, NodeFrame]] = {}


def node_frame(profile: Profile) -> NodeFrame:
    """The (cached) NodeFrame of ``profile``."""
    key = id(profile)
    entry = _FRAMES.get(key)
    if entry is not None and entry[0]() is profile:
        return entry[1]
    frame = NodeFrame(profile)
    def forget(_ref: Any, key: int = key) -> None:
        _FRAMES.pop(key, None)

    _FRAMES[key] = (weakref.ref(profile, forget), frame)
    return frame
