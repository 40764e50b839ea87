"""Memory views of a profile: the peak and what causes it, and live bytes over the step.

Pure functions over the memory pass's records (``NodeRecord.memory`` and
``GraphRecord.memory_peak``) and, on an accelerator, the allocator samples
(``GraphRecord.device_memory``). Nothing here prints; ``graphprof.render``
turns the results into text and SVG.
"""

from __future__ import annotations

import operator
import statistics
from dataclasses import dataclass
from typing import Any

from graphprof.analysis.frame import graph_column, graph_record
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


def memory_summary(profile: Profile, graph_id: int = 0) -> MemorySummary:
    """The memory peak of graph ``graph_id``: bytes, node, module, source line, categories, tensors."""
    graph = find_graph(profile, graph_id)
    if graph is None:
        return MemorySummary(str(graph_id), False, 0, None, 0, 0, 0, 0, (), ())
    # Columns, not records: only the nodes the summary names are built.
    kept = [i for i, v in enumerate(graph_column(graph, "live_bytes")) if v is not None]  # nodes with a record
    peak = graph.memory_peak
    if not kept or peak is None:
        return MemorySummary(graph.name, False, 0, None, 0, 0, 0, 0, (), (), _device_stats(graph))
    position = {node_id: i for i, node_id in enumerate(graph_column(graph, "id"))}

    def ref(node_id: int) -> NodeRef | None:
        return _ref(graph_record(graph, position[node_id])) if node_id in position else None

    cats = sorted(((c, b) for c, b in peak.by_category_bytes.items() if b), key=lambda kv: (-kv[1], kv[0]))
    largest = tuple(PeakTensorRow(t.name, t.nbytes, t.category, ref(t.node_id)) for t in peak.largest_tensors)
    workspace = graph_column(graph, "workspace_allocated_bytes")
    allocated, freed = graph_column(graph, "allocated_bytes"), graph_column(graph, "freed_bytes")
    return MemorySummary(
        graph=graph.name,
        has_model=True,
        peak_bytes=peak.live_bytes,
        peak_node=ref(peak.node_id),
        start_bytes=peak.start_bytes,
        end_bytes=graph_column(graph, "live_bytes")[kept[-1]],
        # kernel workspace (measured, runtime/workspace.py) is allocated in the step too
        allocated_bytes=sum(allocated[i] + workspace[i] for i in kept),
        freed_bytes=sum(freed[i] + workspace[i] for i in kept),  # workspace is freed inside its op
        by_category_bytes=tuple(cats),
        largest=largest,
        device=_device_stats(graph),
    )


def memory_timeline(profile: Profile, graph_id: int = 0) -> MemoryTimeline:
    """Live bytes by category after every op node of graph ``graph_id`` (empty without records)."""
    graph = find_graph(profile, graph_id)
    name = graph.name if graph is not None else str(graph_id)
    # Columns, not records: a timeline of a loaded graph builds no NodeRecord.
    live_column = graph_column(graph, "live_bytes") if graph is not None else []
    kept = [i for i, v in enumerate(live_column) if v is not None]  # nodes with a memory record
    if not kept:
        return MemoryTimeline(name, (), (), (), (), (), (), (), 0, -1, 0)
    assert graph is not None
    pick = operator.itemgetter(*kept)

    def picked(column: str) -> tuple[Any, ...]:
        values = pick(graph_column(graph, column))
        return values if len(kept) > 1 else (values,)

    by_category = picked("live_by_category_bytes")
    categories = _ordered_categories(  # categories that are ever non-zero (a file may hold explicit zeros)
        {c for cats in by_category for c, b in cats.items() if b})
    per_cat = tuple(tuple(int(cats.get(c, 0)) for cats in by_category) for c in categories)
    live = picked("live_bytes")
    freed, allocated = picked("freed_bytes"), picked("allocated_bytes")
    during = tuple(a + f + w for a, f, w in zip(live, freed, picked("workspace_bytes")))
    start = live[0] + freed[0] - allocated[0]
    ids = picked("id")
    peak = graph.memory_peak if graph is not None else None
    index_of = {node_id: i for i, node_id in enumerate(ids)}
    if peak is not None and peak.node_id in index_of:
        peak_index, peak_bytes = index_of[peak.node_id], peak.live_bytes
    else:
        peak_index = max(range(len(during)), key=during.__getitem__)
        peak_bytes = during[peak_index]
    return MemoryTimeline(
        graph=name,
        categories=categories,
        node_ids=ids,
        node_names=picked("name"),
        phases=picked("phase"),
        live_by_category=per_cat,
        live_bytes=live,
        during_bytes=during,
        start_bytes=start,
        peak_index=peak_index,
        peak_bytes=peak_bytes,
        device_allocated=_device_series(graph, index_of) if graph is not None else (),
    )


def _device_series(graph: GraphRecord, index_of: dict[int, int]) -> tuple[tuple[int, int], ...]:
    by_node: dict[int, list[int]] = {}
    for s in graph.device_memory:
        if s.node_id in index_of:
            by_node.setdefault(index_of[s.node_id], []).append(s.allocated_bytes)
    return tuple((i, int(statistics.median(v))) for i, v in sorted(by_node.items()))
