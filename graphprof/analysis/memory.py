"""Memory views of a profile: the peak and what causes it, and live bytes over the step.

Pure functions over the memory pass's records (``NodeRecord.memory`` and
``GraphRecord.memory_peak``) and, on an accelerator, the allocator samples
(``GraphRecord.device_memory``). Nothing here prints; ``graphprof.render``
turns the results into text and SVG.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphprof.analysis.frame import graph_column, graph_record, node_frame
from graphprof.analysis.memory_columns import GraphMemory, graph_memory, last_index
from graphprof.analysis.node_arrays import exact_sum
from graphprof.profile.model import MEMORY_CATEGORIES, GraphRecord, NodeRecord, Profile


@dataclass(frozen=True)
class NodeRef:
    """Where a node sits in the user's program."""

    id: int
    name: str
    op: str
    module: str
    module_type: str
    source: str
    phase: str


@dataclass(frozen=True)
class PeakTensorRow:
    """A storage alive at the peak; ``made_by`` is None for state and graph inputs."""

    name: str
    nbytes: int
    category: str
    made_by: NodeRef | None


@dataclass(frozen=True)
class DeviceMemoryStats:
    """What the accelerator's allocator reported over the profiled steps."""

    samples: int
    steps: int
    max_allocated_bytes: int
    max_peak_bytes: int
    max_reserved_bytes: int


@dataclass(frozen=True)
class MemorySummary:
    """A graph's modelled memory: its peak, where it happens, and what is alive then.

    ``has_model`` is False when the profile carries no memory records (then
    every number is 0); ``device`` is set when allocator samples exist.
    """

    graph: str
    has_model: bool
    peak_bytes: int
    peak_node: NodeRef | None
    start_bytes: int
    end_bytes: int
    allocated_bytes: int
    freed_bytes: int
    by_category_bytes: tuple[tuple[str, int], ...]
    largest: tuple[PeakTensorRow, ...]
    device: DeviceMemoryStats | None = None


@dataclass(frozen=True)
class MemoryTimeline:
    """Live bytes by category after every op node, in execution order.

    ``live_by_category[c][i]`` are the bytes of ``categories[c]`` live after
    node ``i``; ``during_bytes[i]`` is the total while node ``i`` runs (its
    outputs next to the inputs it frees, plus its measured kernel workspace),
    whose largest value is the peak.
    ``device_allocated`` holds (node index, median allocated bytes over the
    profiled steps) for the nodes where the allocator was read.
    """

    graph: str
    categories: tuple[str, ...]
    node_ids: tuple[int, ...]
    node_names: tuple[str, ...]
    phases: tuple[str, ...]
    live_by_category: tuple[tuple[int, ...], ...]
    live_bytes: tuple[int, ...]
    during_bytes: tuple[int, ...]
    start_bytes: int
    peak_index: int
    peak_bytes: int
    device_allocated: tuple[tuple[int, int], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.node_ids


@dataclass(frozen=True)
class TimelineColumns:
    """A ``MemoryTimeline`` with its per-node series as arrays (int64, or object arrays of Python ints).

    Why: the SVG reduces 100,000 nodes to a few hundred pixel columns, which
    numpy does over arrays at once; tuples of Python ints are only made for
    callers of ``memory_timeline``.
    """

    graph: str
    categories: tuple[str, ...]
    node_ids: list[int]
    node_names: list[str]
    phases: list[str]
    live_by_category: tuple[np.ndarray, ...]
    live_bytes: np.ndarray
    during_bytes: np.ndarray
    start_bytes: int
    peak_index: int
    peak_bytes: int
    device_allocated: tuple[tuple[int, int], ...] = ()

    def timeline(self) -> MemoryTimeline:
        return MemoryTimeline(
            self.graph, self.categories, tuple(self.node_ids), tuple(self.node_names), tuple(self.phases),
            tuple(tuple(v.tolist()) for v in self.live_by_category), tuple(self.live_bytes.tolist()),
            tuple(self.during_bytes.tolist()), self.start_bytes, self.peak_index, self.peak_bytes,
            self.device_allocated)


def find_graph(profile: Profile, graph_id: int = 0) -> GraphRecord | None:
    """The graph with id ``graph_id``; None when the profile has no such graph."""
    return next((g for g in profile.graphs if g.id == graph_id), None)


def _ref(node: NodeRecord) -> NodeRef:
    return NodeRef(node.id, node.name, node.op, node.module, node.module_type, node.source, node.phase.value)


def _ordered_categories(names: set[str]) -> tuple[str, ...]:
    known = [c for c in MEMORY_CATEGORIES if c in names]
    return tuple(known + sorted(names - set(known)))


def _device_stats(graph: GraphRecord) -> DeviceMemoryStats | None:
    samples = graph.device_memory
    if not samples:
        return None
    return DeviceMemoryStats(
        samples=len(samples),
        steps=len({s.step for s in samples}),
        max_allocated_bytes=max(s.allocated_bytes for s in samples),
        max_peak_bytes=max(s.peak_bytes for s in samples),
        max_reserved_bytes=max(s.reserved_bytes for s in samples),
    )


def _scalar(value: Any) -> Any:
    """An array element as the Python number the records hold (object arrays hold those already)."""
    return value.item() if isinstance(value, np.generic) else value


def _graph_memory(profile: Profile, graph: GraphRecord) -> GraphMemory:
    """``graph_memory(graph)``, read once per profile: the summary and the timeline both need it."""
    return node_frame(profile).memo(("graph_memory", graph.id), lambda: graph_memory(graph))  # type: ignore[no-any-return]


def memory_summary(profile: Profile, graph_id: int = 0) -> MemorySummary:
    """The memory peak of graph ``graph_id``: bytes, node, module, source line, categories, tensors."""
    graph = find_graph(profile, graph_id)
    if graph is None:
        return MemorySummary(str(graph_id), False, 0, None, 0, 0, 0, 0, (), ())
    # Columns, not records: only the nodes the summary names are built.
    memory = _graph_memory(profile, graph)
    peak = graph.memory_peak
    if not len(memory) or peak is None:
        return MemorySummary(graph.name, False, 0, None, 0, 0, 0, 0, (), (), _device_stats(graph))
    ids = graph_column(graph, "id")

    def ref(node_id: int) -> NodeRef | None:
        i = last_index(ids, node_id)
        return _ref(graph_record(graph, i)) if i is not None else None

    cats = sorted(((c, b) for c, b in peak.by_category_bytes.items() if b), key=lambda kv: (-kv[1], kv[0]))
    largest = tuple(PeakTensorRow(t.name, t.nbytes, t.category, ref(t.node_id)) for t in peak.largest_tensors)
    fields = memory.fields
    workspace = fields["workspace_allocated_bytes"]
    return MemorySummary(
        graph=graph.name,
        has_model=True,
        peak_bytes=peak.live_bytes,
        peak_node=ref(peak.node_id),
        start_bytes=peak.start_bytes,
        end_bytes=_scalar(fields["live_bytes"][-1]),
        # kernel workspace (measured, runtime/workspace.py) is allocated in the step too
        allocated_bytes=exact_sum((fields["allocated_bytes"] + workspace)),
        freed_bytes=exact_sum((fields["freed_bytes"] + workspace)),  # workspace is freed inside its op
        by_category_bytes=tuple(cats),
        largest=largest,
        device=_device_stats(graph),
    )


def timeline_columns(profile: Profile, graph_id: int = 0) -> TimelineColumns:
    """``memory_timeline`` as arrays (what a plot that reduces nodes to pixel columns reads)."""
    graph = find_graph(profile, graph_id)
    name = graph.name if graph is not None else str(graph_id)
    memory = _graph_memory(profile, graph) if graph is not None else None
    if graph is None or memory is None or not len(memory):
        return TimelineColumns(name, (), [], [], [], (), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                               0, -1, 0)
    fields = memory.fields
    categories = _ordered_categories(  # categories that are ever non-zero (a file may hold explicit zeros)
        {c for c, values in memory.by_category.items() if values.any()})
    live, freed, allocated = fields["live_bytes"], fields["freed_bytes"], fields["allocated_bytes"]
    during = live + freed + fields["workspace_bytes"]
    ids = memory.pick(graph_column(graph, "id"))
    peak = graph.memory_peak
    at = last_index(ids, peak.node_id) if peak is not None else None
    if peak is not None and at is not None:
        peak_index, peak_bytes = at, peak.live_bytes
    else:
        peak_index = int(np.argmax(during))  # the first of equal largest values
        peak_bytes = _scalar(during[peak_index])
    device: tuple[tuple[int, int], ...] = ()
    if graph.device_memory:
        device = _device_series(graph, {node_id: i for i, node_id in enumerate(ids)})
    return TimelineColumns(
        graph=name,
        categories=categories,
        node_ids=ids,
        node_names=memory.pick(graph_column(graph, "name")),
        phases=memory.pick(graph_column(graph, "phase")),
        live_by_category=tuple(memory.by_category[c] for c in categories),
        live_bytes=live,
        during_bytes=during,
        start_bytes=_scalar(live[0] + freed[0] - allocated[0]),
        peak_index=peak_index,
        peak_bytes=peak_bytes,
        device_allocated=device,
    )


def memory_timeline(profile: Profile, graph_id: int = 0) -> MemoryTimeline:
    """Live bytes by category after every op node of graph ``graph_id`` (empty without records)."""
    return timeline_columns(profile, graph_id).timeline()


def _device_series(graph: GraphRecord, index_of: dict[int, int]) -> tuple[tuple[int, int], ...]:
    by_node: dict[int, list[int]] = {}
    for s in graph.device_memory:
        if s.node_id in index_of:
            by_node.setdefault(index_of[s.node_id], []).append(s.allocated_bytes)
    return tuple((i, int(statistics.median(v))) for i, v in sorted(by_node.items()))
