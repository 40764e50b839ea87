"""The records of a profile: frozen dataclasses of plain Python values.

Why plain values: a saved profile must be analysed on a machine without torch,
loaded without running code, and compared across versions. Everything here is
ints, floats, strings, tuples and enums; nothing refers to a tensor or a graph.

Raw data only (pyinstrument's rule): per-node samples for every profiled step
are kept, and statistics are computed by ``graphprof.analysis`` on demand.

Times: a node's samples are integer nanoseconds (``host_time_ns``,
``device_time_ns``), the unit the runtime's clock gives, and they stay that from
the probe to the file and back: nothing rounds them on the way. ``NS_PER_S`` is
the one tick of the package; seconds are made only where a view needs them
(``graphprof.analysis.node_time.node_time_s``). This module imports nothing of
graphprof: every other profile module builds on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union, overload

SCHEMA_ID = "graphprof.profile/1"

#: Nanoseconds per second: the tick of every time sample, in memory and in files.
NS_PER_S = 1_000_000_000

#: An op attribute's value: what the pass recorded, typed (a count stays an int, a flag a bool).
AttrValue = Union[str, int, float, bool]

#: Attribute keys whose values are counts or flags. Files written before attrs
#: were typed hold them as text ("1024", "true", ""); ``typed_attr`` reads that
#: form back as the value it stood for, so old and new files analyse the same.
_INT_ATTRS = frozenset({"bucket", "bytes", "params", "world_size"})
_BOOL_ATTRS = frozenset({"blocking", "fast_conv_available"})


def typed_attr(key: str, value: AttrValue) -> AttrValue:
    """``value`` of attribute ``key``, with the old text form of a count or flag read as int/bool."""
    if not isinstance(value, str):
        return value
    if key in _INT_ATTRS and value.lstrip("-").isdigit():
        return int(value)
    if key in _BOOL_ATTRS and value in ("true", "false", ""):
        return value == "true"
    return value


def ns_to_s(ns: float) -> float:
    """Seconds of ``ns`` nanoseconds (a division: correctly rounded, so 1500 ns is exactly 1.5e-6)."""
    return ns / NS_PER_S


def seconds_to_ns(times_s: Iterable[float]) -> tuple[int, ...]:
    """Nanosecond samples of times given in seconds (hand-made records, old files): rounded once, here."""
    return tuple(round(t * NS_PER_S) for t in times_s)


class Phase(str, enum.Enum):
    """Which part of a training step a node belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class GraphKind(str, enum.Enum):
    """How a graph was captured: a whole step, or an AOTAutograd segment."""

    STEP = "step"
    FORWARD = "forward"
    BACKWARD = "backward"
    SEGMENT = "segment"
    #: Host-side time around graphs: gradient bookkeeping, gaps, host reads.
    HOST = "host"


#: The host node that holds graphprof's own per-call time in a whole-step profile
#: (signature, guards, pytree, keeping samples): with it, a step's nodes add up to its wall time.
OVERHEAD_NODE = "graphprof.overhead"
OVERHEAD_OP = "host.graphprof_overhead"


#: The memory pass's categories, in the order views stack them (state at the bottom).
MEMORY_CATEGORIES = (
    "parameters", "buffers", "optimizer_state", "inputs", "gradients",
    "activations", "temporaries", "outputs",
)


@dataclass(frozen=True)
class MemoryRecord:
    """Modelled memory of one node (bytes), filled by the memory pass.

    ``workspace_bytes`` is the kernel's measured scratch peak inside the call
    (allocated and freed within the op, e.g. oneDNN reorders) and
    ``workspace_allocated_bytes`` the scratch it allocated in all; both are
    measured once, during the first replayed step, from torch.profiler's
    allocator events, and are 0 when not measured. They are not part of
    ``allocated_bytes``/``live_bytes``, which stay the shape-based model.
    """

    allocated_bytes: int = 0
    freed_bytes: int = 0
    live_bytes: int = 0
    live_by_category_bytes: Mapping[str, int] = field(default_factory=dict)
    workspace_bytes: int = 0
    workspace_allocated_bytes: int = 0


@dataclass(frozen=True)
class PeakTensor:
    """A storage alive at a graph's memory peak.

    ``node_id`` is the op node that allocated it, or -1 for a graph input or
    state tensor (parameters, optimizer state), which ``name`` then names.
    """

    name: str
    nbytes: int
    category: str
    node_id: int = -1


@dataclass(frozen=True)
class MemoryPeak:
    """A graph's modelled memory peak: where it happens and what is alive then.

    ``live_bytes`` is the high-water mark while node ``node_id`` runs (its
    outputs next to the inputs it frees); ``start_bytes`` is what is live
    before the graph's first op (state and inputs), ``allocated_bytes`` the
    graph's total allocations.
    """

    node_id: int
    live_bytes: int
    by_category_bytes: Mapping[str, int] = field(default_factory=dict)
    largest_tensors: tuple[PeakTensor, ...] = ()
    start_bytes: int = 0
    allocated_bytes: int = 0


@dataclass(frozen=True)
class DeviceMemorySample:
    """The accelerator allocator, read after node ``node_id`` in profiled step ``step``.

    Taken every ``sample_rate`` ops (as MegEngine does), next to the modelled
    figures: ``allocated_bytes`` now, ``peak_bytes`` the high-water mark since
    the previous sample, ``reserved_bytes`` what the caching allocator holds.
    """

    step: int
    node_id: int
    allocated_bytes: int
    peak_bytes: int
    reserved_bytes: int = 0


@dataclass(frozen=True)
class NodeRecord:
    """One executed op node of a graph, with its static annotations and samples.

    ``inputs`` holds the ids of the op nodes that produce this node's tensor
    inputs: they are the dataflow edges. ``host_time_ns`` and ``device_time_ns``
    hold one sample per profiled step, in step order, in integer nanoseconds;
    ``host_time_s``/``device_time_s`` give them in seconds. ``is_inplace`` is
    the annotate pass's verdict that the op writes one of its inputs; None in
    records that do not say (files written before it, hand-made records), for
    which ``graphprof.analysis.dataflow.is_inplace_write`` reads the op's name.
    """

    id: int
    name: str
    op: str
    type: str
    inputs: tuple[int, ...] = ()
    in_shapes: tuple[tuple[int, ...] | None, ...] = ()
    in_dtypes: tuple[str | None, ...] = ()
    out_shapes: tuple[tuple[int, ...] | None, ...] = ()
    out_dtypes: tuple[str | None, ...] = ()
    module: str = ""
    module_type: str = ""
    source: str = ""
    phase: Phase = Phase.OTHER
    scope: str = ""
    is_view: bool = False
    is_inplace: bool | None = None
    flops: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    memory: MemoryRecord | None = None
    host_time_ns: tuple[int, ...] = ()
    device_time_ns: tuple[int, ...] = ()
    #: Op-specific facts as (key, value) pairs: conv backend, copy devices, collective sizes.
    attrs: tuple[tuple[str, AttrValue], ...] = ()

    @property
    def host_time_s(self) -> tuple[float, ...]:
        """The host samples in seconds."""
        return tuple([t / NS_PER_S for t in self.host_time_ns])

    @property
    def device_time_s(self) -> tuple[float, ...]:
        """The device samples in seconds (empty where no device clock ran)."""
        return tuple([t / NS_PER_S for t in self.device_time_ns])


class NodeSource:
    """Where a graph's NodeRecords come from when they are not built yet: a loaded file's columns.

    ``graphprof.profile.node_columns.NodeColumns`` is the one implementation;
    it lives there because it knows the column layout, and this module imports
    nothing of graphprof.
    """

    size: int

    def node_records(self) -> tuple[NodeRecord, ...]:
        raise NotImplementedError


class _NodesField:
    """The ``nodes`` field of GraphRecord: the NodeRecord tuple, built on first read when a NodeSource was given.

    Why a descriptor (and not a property or a subclass): ``nodes`` stays a
    dataclass field, so ``GraphRecord(..., nodes=...)``, ``replace``, equality,
    ``repr`` and hashing are the dataclass's own and see the tuple; the class
    stays GraphRecord, so a loaded graph equals the graph it was saved from.
    mypy types a descriptor-typed dataclass field by its ``__set__`` (what
    ``__init__`` takes: a tuple or a NodeSource) and ``__get__`` (what reading
    gives: always the tuple). A frozen dataclass's ``__init__`` assigns through
    ``object.__setattr__``, which reaches ``__set__``; ``graph.nodes = x`` still
    raises FrozenInstanceError.
    """

    @overload
    def __get__(self, obj: None, owner: Any = None) -> tuple[NodeRecord, ...]: ...

    @overload
    def __get__(self, obj: object, owner: Any = None) -> tuple[NodeRecord, ...]: ...

    def __get__(self, obj: object | None, owner: Any = None) -> tuple[NodeRecord, ...]:
        if obj is None:
            return ()  # the field's default (dataclass asks the class for it)
        state = obj.__dict__
        nodes = state.get("nodes")
        if nodes is None:
            nodes = state["nodes"] = state["node_source"].node_records()
        return nodes  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: tuple[NodeRecord, ...] | NodeSource) -> None:
        if isinstance(value, NodeSource):
            obj.__dict__["node_source"] = value
            obj.__dict__["nodes"] = None
        else:
            obj.__dict__["nodes"] = value


@dataclass(frozen=True)
class GraphRecord:
    """A captured graph and its op nodes in execution order.

    A loaded graph is given its file's columns (a NodeSource) instead of the
    NodeRecords: they are built on the first read of ``nodes`` (see
    ``_NodesField``), and views that read columns never need them.
    """

    id: int
    name: str
    kind: GraphKind
    nodes: _NodesField = _NodesField()
    memory_peak: MemoryPeak | None = None
    device_memory: tuple[DeviceMemorySample, ...] = ()


def node_source(graph: GraphRecord) -> NodeSource | None:
    """The columns ``graph`` was loaded from (kept after its NodeRecords are built), or None for built records."""
    return graph.__dict__.get("node_source")  # type: ignore[no-any-return]


def graph_size(graph: GraphRecord) -> int:
    """How many nodes ``graph`` has, without building its NodeRecords."""
    source = node_source(graph)
    return source.size if source is not None else len(graph.nodes)


@dataclass(frozen=True)
class StepRecord:
    """One profiled call of the traced function.

    ``wall_time_s`` is host time from entering the call to the end of the last
    graph; ``graph_time_s`` the part spent inside instrumented graphs.
    """

    index: int
    wall_time_s: float
    graph_time_s: float = 0.0


@dataclass(frozen=True)
class ScheduleInfo:
    """The ``graphprof.schedule`` a profile was taken under, and which cycle of it (file: ``extra.schedule``/``cycle``)."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    #: Which active window of the schedule this profile is (0 first); None when not recorded.
    cycle: int | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """How the graphs were timed and on what (file: ``extra.timing``, ``device``, ``device_capability``...).

    ``timing`` is "pipelined"/"isolated" with device events, "host" when only
    the host clock ran; the rest is known only where a device was found.
    """

    timing: str = "host"
    device: str = ""
    capability: str = ""
    #: Host cost of one device mark in seconds (part of every node's host time); None when not measured.
    mark_cost_s: float | None = None


@dataclass(frozen=True)
class DistributedInfo:
    """The ``torch.distributed`` layout of a profile (file: ``extra.distributed``).

    One rank's profile has ``rank``, ``world_size``, ``backend`` and ``host``;
    a merged one (``graphprof.profile.merge``) has ``merged``, ``ranks`` (per
    rank: its graph ids, step times, host, capture... as plain JSON mappings)
    and ``missing_ranks``. ``fsdp`` is an FSDP2 rank's per-step overlap and
    memory; ``details`` keeps every other entry as it was written (DDP notes,
    ``ddp_buckets_timed``, and values of the wrong type in hand-edited files,
    which merge then refuses with its own sentence).
    """

    rank: int | None = None
    world_size: int | None = None
    backend: str = ""
    host: str = ""
    merged: bool = False
    ranks: tuple[Mapping[str, Any], ...] = ()
    missing_ranks: tuple[int, ...] = ()
    fsdp: Mapping[str, Any] | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recompile:
    """One torch.compile compile after the first call of a segmented capture (file: ``extra.recompiles``)."""

    call: int
    graphs: str  # which segments compiled ("segment 1 forward, segment 1 backward")
    reason: str  # the guard that failed, as dynamo words it
    compile_time_s: float


@dataclass(frozen=True)
class ProfileMeta:
    """Where and how a profile was taken.

    The optional sections (``schedule``, ``device``, ``distributed``,
    ``peaks_note``, ``recompiles``) are typed here and written under the ``extra`` keys files
    have always used; ``extra`` holds only what has no typed field.
    """

    function: str = ""
    capture: str = "fx"
    device_type: str = "cpu"
    device_name: str = ""
    created_at: str = ""
    graphprof_version: str = ""
    torch_version: str = ""
    python_version: str = ""
    probe_cost_s: float = 0.0
    peaks: Mapping[str, float] = field(default_factory=dict)
    schedule: ScheduleInfo | None = None
    device: DeviceInfo | None = None
    distributed: DistributedInfo | None = None
    #: Why the peaks may not fit this run (calibrated with another thread count); "" when they do.
    peaks_note: str = ""
    #: Compiles after the first call (segmented capture); None where the capture cannot recompile.
    recompiles: tuple[Recompile, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


