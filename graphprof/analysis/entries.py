"""Table entries before ordering: one per selected node, or one per group.

Why two light classes rather than rows: a table of a 100,000-node profile
orders every selected node but prints twenty, so entries only hold what
ordering needs and read the rest from the node on demand. Both kinds expose
the same attributes (the column keys of ``graphprof.analysis.columns``).

A value that is not known is ``None``, never 0: a node without a FLOP formula
has ``flops is None``; a rate over a zero-duration op is ``None``, never inf.
"""

from __future__ import annotations

from typing import Any

from graphprof.profile.model import GraphRecord, NodeRecord


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is unknown or the denominator is not > 0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def bytes_moved(read: float | None, written: float | None) -> float | None:
    """Bytes read plus bytes written; None only when both are unknown."""
    if read is None:
        return written
    if written is None:
        return read
    return read + written


class _Derived:
    """Columns computed from the stored ones, shared by node and group entries."""

    __slots__ = ()

    time_s: float
    flops: Any
    bytes_moved: Any
    total_time_s: float

    @property
    def percent(self) -> float:
        return 100.0 * self.time_s / self.total_time_s if self.total_time_s > 0 else 0.0

    @property
    def flop_per_s(self) -> float | None:
        return ratio(self.flops, self.time_s)

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return ratio(self.bytes_moved, self.time_s)

    @property
    def intensity_flop_per_byte(self) -> float | None:
        return ratio(self.flops, self.bytes_moved)


class NodeEntry(_Derived):
    """One selected node and its time under the chosen statistic and clock."""

    __slots__ = ("graph_record", "node", "time_s", "total_time_s", "order")
    calls = 1

    def __init__(self, graph: GraphRecord, node: NodeRecord, time_s: float, total_time_s: float, order: int) -> None:
        self.graph_record = graph
        self.node = node
        self.time_s = time_s
        self.total_time_s = total_time_s
        self.order = order  # position in execution order, for stable ties

    # descriptive columns
    id = property(lambda self: self.node.id)
    label = property(lambda self: self.node.name)
    name = property(lambda self: self.node.name)
    op = property(lambda self: self.node.op)
    type = property(lambda self: self.node.type)
    module = property(lambda self: self.node.module)
    module_type = property(lambda self: self.node.module_type)
    source = property(lambda self: self.node.source)
    phase = property(lambda self: self.node.phase.value)
    scope = property(lambda self: self.node.scope)
    graph = property(lambda self: self.graph_record.name)
    in_shapes = property(lambda self: self.node.in_shapes)
    out_shapes = property(lambda self: self.node.out_shapes)
    in_dtypes = property(lambda self: self.node.in_dtypes)

    # measured columns
    flops = property(lambda self: self.node.flops)
    bytes_read = property(lambda self: self.node.bytes_read)
    bytes_written = property(lambda self: self.node.bytes_written)

    @property
    def bytes_moved(self) -> float | None:  # type: ignore[override]
        return bytes_moved(self.node.bytes_read, self.node.bytes_written)

    @property
    def allocated_bytes(self) -> int | None:
        memory = self.node.memory
        return None if memory is None else memory.allocated_bytes

    @property
    def freed_bytes(self) -> int | None:
        memory = self.node.memory
        return None if memory is None else memory.freed_bytes

    @property
    def live_bytes(self) -> int | None:
        memory = self.node.memory
        return None if memory is None else memory.live_bytes


class GroupEntry(_Derived):
    """Nodes folded into one row by ``--aggregate``/``--aggregate-by``.

    Descriptive fields hold the members' common value, or None when members
    differ (e.g. ``type`` of a module group with several op types).
    """

    #: How many nodes the group folds (set from ``values``, as every column is).
    calls: int

    def __init__(self, label: str, total_time_s: float, order: int, values: dict[str, Any]) -> None:
        self.label = label
        self.total_time_s = total_time_s
        self.order = order
        self.id = None
        self.__dict__.update(values)
