"""The Profile data model: frozen dataclasses of plain Python values.

Why plain values: a saved profile must be analysed on a machine without torch,
loaded without running code, and compared across versions. Everything here is
ints, floats, strings, tuples and enums; nothing refers to a tensor or a graph.

Raw data only (pyinstrument's rule): per-node samples for every profiled step
are kept, and statistics are computed by ``graphprof.analysis`` on demand.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

SCHEMA_ID = "graphprof.profile/1"


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
    inputs: they are the dataflow edges. ``host_time_s`` and ``device_time_s``
    hold one sample per profiled step, in step order.
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
    flops: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    memory: MemoryRecord | None = None
    host_time_s: tuple[float, ...] = ()
    device_time_s: tuple[float, ...] = ()
    #: Op-specific facts as (key, value) pairs: conv backend, copy devices.
    attrs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GraphRecord:
    """A captured graph and its op nodes in execution order."""

    id: int
    name: str
    kind: GraphKind
    nodes: tuple[NodeRecord, ...] = ()
    memory_peak: MemoryPeak | None = None
    device_memory: tuple[DeviceMemorySample, ...] = ()


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
class ProfileMeta:
    """Where and how a profile was taken."""

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
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Profile(dict):
    """A whole profile: meta, profiled steps and graphs.

    It is also a read-only ``dict`` whose items are its JSON document, so that
    MegEngine users' habit ``json.dump(fn.get_profile(), f)`` writes a file that
    ``graphprof.load`` reads. The document is built on first use, not stored.
    """

    meta: ProfileMeta = field(default_factory=ProfileMeta)
    steps: tuple[StepRecord, ...] = ()
    graphs: tuple[GraphRecord, ...] = ()

    def __post_init__(self) -> None:
        # json's C encoder skips dict subclasses whose real storage is empty,
        # so one real key is kept; every other read goes through _document().
        dict.__setitem__(self, "schema", SCHEMA_ID)

    # -- dict view of the JSON document --------------------------------------
    def _document(self) -> dict[str, Any]:
        cached = self.__dict__.get("_json_document")
        if cached is None:
            from graphprof.profile.serialize import profile_to_document

            cached = profile_to_document(self)
            object.__setattr__(self, "_json_document", cached)
        return cached

    def __getitem__(self, key: str) -> Any:
        return self._document()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._document())

    def __len__(self) -> int:
        return len(self._document())

    def __contains__(self, key: object) -> bool:
        return key in self._document()

    def keys(self):  # type: ignore[override]
        return self._document().keys()

    def items(self):  # type: ignore[override]
        return self._document().items()

    def values(self):  # type: ignore[override]
        return self._document().values()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self._document().get(key, default)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return (self.meta, self.steps, self.graphs) == (other.meta, other.steps, other.graphs)

    __hash__ = None  # type: ignore[assignment]

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a Profile is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]

    def __repr__(self) -> str:
        nodes = sum(len(g.nodes) for g in self.graphs)
        return (
            f"Profile(function={self.meta.function!r}, graphs={len(self.graphs)}, "
            f"nodes={nodes}, steps={len(self.steps)})"
        )

    # -- convenience -----------------------------------------------------------
    def iter_nodes(self) -> Iterator[tuple[GraphRecord, NodeRecord]]:
        """Every node of every graph, with its graph, in execution order."""
        for graph in self.graphs:
            for node in graph.nodes:
                yield graph, node

    @property
    def node_count(self) -> int:
        return sum(len(g.nodes) for g in self.graphs)

    def save(self, path: str) -> None:
        """Write the profile as JSON, atomically (a crash leaves no half file)."""
        from graphprof.profile.serialize import save_profile

        save_profile(self, path)
