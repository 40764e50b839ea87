"""A profile's nodes as flat columns, computed once per profile and shared by every analysis.

Why: ``graphprof report`` builds five tables, a roofline, the critical paths
and the advisor's findings from one profile. Each used to walk every node
again (flatten the graphs, take each node's median, read each attribute
through an entry object); on a 100,000-node profile that repeated walking
was most of the command's time. Here each walk happens once: the flat
(graph, node) list, each node's time under a statistic and clock, and any
column (one Python list per attribute, in execution order) are computed on
first use and kept while the profile lives.

The cache is keyed by the profile object's identity and dropped with it
(a weak reference): a Profile is immutable, so nothing it derives can go stale.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from graphprof.analysis.node_time import node_times_s
from graphprof.profile.model import GraphRecord, NodeRecord, Profile

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


#: Columns that are not a plain NodeRecord attribute: how to read them from a node.
_DERIVED: dict[str, Callable[[NodeRecord], Any]] = {
    "phase": lambda n: n.phase.value,
    "bytes_moved": _moved,
    "allocated_bytes": _memory_field("allocated_bytes"),
    "freed_bytes": _memory_field("freed_bytes"),
    "live_bytes": _memory_field("live_bytes"),
}


class NodeFrame:
    """Every node of one profile in execution order, with cached per-node columns."""

    __slots__ = ("pairs", "_graphs", "_times", "_columns", "_memo", "__weakref__")

    def __init__(self, profile: Profile) -> None:
        self.pairs: NodePairs = [(g, n) for g in profile.graphs for n in g.nodes]
        self._graphs = profile.graphs
        self._times: dict[tuple[str, str], list[float]] = {}
        self._columns: dict[str, list[Any]] = {}
        self._memo: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def times(self, stat: str, clock: str) -> list[float]:
        """Each node's ``node_time_s`` under ``stat`` on ``clock`` (``auto``, ``host`` or ``device``)."""
        key = (stat, clock)
        cached = self._times.get(key)
        if cached is None:
            cached = self._times[key] = node_times_s((n for _, n in self.pairs), stat, clock)
        return cached

    def column(self, name: str) -> list[Any]:
        """The value of ``name`` for every node: a NodeRecord field or a derived column of ``_DERIVED``.

        ``graph`` is the graph's name, ``graph_index`` the graph's position in ``profile.graphs``
        and ``graph_id`` its id.
        """
        cached = self._columns.get(name)
        if cached is None:
            if name == "graph":
                cached = [g.name for g, _ in self.pairs]
            elif name in ("graph_index", "graph_id"):
                cached = [i if name == "graph_index" else g.id for i, g in enumerate(self._graphs) for _ in g.nodes]
            elif name in _DERIVED:
                read = _DERIVED[name]
                cached = [read(n) for _, n in self.pairs]
            else:
                cached = [getattr(n, name) for _, n in self.pairs]
            self._columns[name] = cached
        return cached


    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, computed once per ``key`` for this profile (for results of pure analyses)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


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
