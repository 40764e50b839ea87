"""Memory views of a profile: the peak and what causes it, and live bytes over the step.

Pure functions over the memory pass's records (``NodeRecord.memory`` and
``GraphRecord.memory_peak``) and, on an accelerator, the allocator samples
(``GraphRecord.device_memory``). Nothing here prints; ``graphprof.render``
turns the results into text and SVG.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

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
    nodes = [n for n in graph.nodes if n.memory is not None]
    peak = graph.memory_peak
    if not nodes or peak is None:
        return MemorySummary(graph.name, False, 0, None, 0, 0, 0, 0, (), (), _device_stats(graph))
    by_id = {n.id: n for n in graph.nodes}
    peak_node = by_id.get(peak.node_id)
    cats = sorted(((c, b) for c, b in peak.by_category_bytes.items() if b), key=lambda kv: (-kv[1], kv[0]))
    largest = tuple(
        PeakTensorRow(t.name, t.nbytes, t.category, _ref(by_id[t.node_id]) if t.node_id in by_id else None)
        for t in peak.largest_tensors
    )
    return MemorySummary(
        graph=graph.name,
        has_model=True,
        peak_bytes=peak.live_bytes,
        peak_node=_ref(peak_node) if peak_node is not None else None,
        start_bytes=peak.start_bytes,
        end_bytes=nodes[-1].memory.live_bytes,  # type: ignore[union-attr]
        # kernel workspace (measured, runtime/workspace.py) is allocated in the step too
        allocated_bytes=sum(n.memory.allocated_bytes + n.memory.workspace_allocated_bytes  # type: ignore[union-attr,misc]
                            for n in nodes),
        freed_bytes=sum(n.memory.freed_bytes + n.memory.workspace_allocated_bytes  # type: ignore[union-attr,misc]
                        for n in nodes),  # workspace is freed inside its op
        by_category_bytes=tuple(cats),
        largest=largest,
        device=_device_stats(graph),
    )


def memory_timeline(profile: Profile, graph_id: int = 0) -> MemoryTimeline:
    """Live bytes by category after every op node of graph ``graph_id`` (empty without records)."""
    graph = find_graph(profile, graph_id)
    name = graph.name if graph is not None else str(graph_id)
    nodes = [n for n in graph.nodes if n.memory is not None] if graph is not None else []
    if not nodes:
        return MemoryTimeline(name, (), (), (), (), (), (), (), 0, -1, 0)
    categories = _ordered_categories(  # categories that are ever non-zero (a file may hold explicit zeros)
        {c for n in nodes for c, b in n.memory.live_by_category_bytes.items() if b})  # type: ignore[union-attr]
    per_cat = tuple(tuple(int(n.memory.live_by_category_bytes.get(c, 0)) for n in nodes) for c in categories)  # type: ignore[union-attr]
    live = tuple(n.memory.live_bytes for n in nodes)  # type: ignore[union-attr]
    during = tuple(n.memory.live_bytes + n.memory.freed_bytes + n.memory.workspace_bytes  # type: ignore[union-attr]
                   for n in nodes)
    first = nodes[0].memory
    start = first.live_bytes + first.freed_bytes - first.allocated_bytes  # type: ignore[union-attr]
    peak = graph.memory_peak if graph is not None else None
    index_of = {n.id: i for i, n in enumerate(nodes)}
    if peak is not None and peak.node_id in index_of:
        peak_index, peak_bytes = index_of[peak.node_id], peak.live_bytes
    else:
        peak_index = max(range(len(during)), key=during.__getitem__)
        peak_bytes = during[peak_index]
    return MemoryTimeline(
        graph=name,
        categories=categories,
        node_ids=tuple(n.id for n in nodes),
        node_names=tuple(n.name for n in nodes),
        phases=tuple(n.phase.value for n in nodes),
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
