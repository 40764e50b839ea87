"""What an annotated graph picture shows: the nodes, edges and clusters to draw.

Kept apart from the DOT syntax so the choices are testable on their own:

- **Node level**: one box per op node, clustered by graph, phase and module
  path (nested: ``layer1`` ⊃ ``layer1.0`` ⊃ ``layer1.0.conv1``). Phases get
  their own clusters because backward ops carry the module of the forward op
  they differentiate; mixing both in one cluster tangles the drawing.
- **Hiding views and constants** (``hide_views``): views (``is_view``), tuple
  projections (``getitem``) and constant factories without inputs (``empty``,
  ``zeros``, ``full``, ...) are left out; their predecessors are linked to
  their successors so no dependency disappears.
- **Module level**: one box per (graph, phase, module prefix), the prefix depth
  being the deepest that keeps at most ``MODULE_LEVEL_BOXES`` boxes, so a
  5,000-node graph becomes at most a hundred and fifty readable boxes. Chosen automatically above
  ``max_nodes`` op nodes. Every op's time counts towards its box, so hiding
  views does not apply there.
- The critical path (``analysis.critical_path``) is marked on the boxes it
  passes through and on the edges between consecutive ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from graphprof.analysis.aggregate import truncate_module
from graphprof.analysis.critical_path import critical_path, graph_critical_path
from graphprof.analysis.dataflow import EdgeArrays, EdgeKind, dataflow_graph, edge_arrays
from graphprof.analysis.frame import node_frame
from graphprof.profile.model import GraphRecord, NodeRecord, Profile, graph_size
from graphprof.render.labels import bound_of, shapes_text
from graphprof.render.node_columns import graph_spans
from graphprof.render.units import format_bytes, format_count, format_time

if TYPE_CHECKING:  # the node-level view of a small graph imports it; the module-level view never needs it
    import networkx as nx

CONSTANT_FACTORIES = frozenset({
    "empty", "empty_strided", "zeros", "ones", "full", "scalar_tensor", "arange", "lift_fresh_copy",
    "new_empty", "new_zeros", "new_ones", "new_full", "_tensor_constant",
})
TOP_LEVEL = "(top level)"
#: At most this many boxes in a module-level picture (fewer when ``max_nodes`` is smaller).
MODULE_LEVEL_BOXES = 150


@dataclass(frozen=True)
class ViewNode:
    """One box: an op node or a module group."""

    key: str
    title: str
    subtitle: str
    time_s: float
    share: float
    flops: int | None
    bound: str | None
    cluster: tuple[str, ...]
    tooltip: str
    critical: bool
    members: int


@dataclass(frozen=True)
class ViewEdge:
    """An arrow; ``layout_only`` ones are invisible and only keep a source op near where it runs.

    ``cross_phase`` arrows (a forward activation saved for backward) are drawn
    without pulling their ends together: otherwise the forward op that saves
    it is dragged down next to the backward op that reads it.
    """

    src: str
    dst: str
    kind: EdgeKind
    critical: bool
    layout_only: bool = False
    cross_phase: bool = False


@dataclass(frozen=True)
class GraphView:
    """Boxes, arrows and the facts the legend states."""

    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    module_level: bool
    depth: int | None
    total_time_s: float
    critical_length_s: float
    serial_s: float
    hidden: int
    stat: str
    op_nodes: int


def is_hideable(node: NodeRecord) -> bool:
    """Views, tuple projections and input-less constant factories."""
    return node.is_view or node.type == "getitem" or (not node.inputs and node.type in CONSTANT_FACTORIES)


def _module_depth(module: str) -> int:
    return len([p for p in module.split(".") if p])


def _node_tooltip(node: NodeRecord, time_s: float) -> str:
    lines = [f"{node.name}: {node.op}", f"module: {node.module or TOP_LEVEL} ({node.module_type or '-'})",
             f"source: {node.source or '-'}", f"in: {shapes_text(node.in_shapes, limit=6)}",
             f"out: {shapes_text(node.out_shapes, limit=6)}", f"time: {format_time(time_s)}",
             f"FLOPs: {format_count(node.flops, 'FLOP')}",
             f"bytes: {format_bytes((node.bytes_read or 0) + (node.bytes_written or 0)) if node.bytes_read is not None else 'N/A'}"]
    if node.scope:
        lines.append(f"scope: {node.scope}")
    return "\n".join(lines)


def _choose_depth(profile: Profile, max_nodes: int) -> int:
    """The deepest module depth whose (graph, phase, module prefix) groups fit in ``max_nodes`` boxes.

    Works on the distinct (graph, phase, module) triples, a few thousand even
    in a 100,000-node profile, rather than on every node at every depth.
    """
    frame = node_frame(profile)
    triples = set(zip(frame.column("graph_id"), frame.column("phase"), frame.column("module")))
    parts = {module: [p for p in module.split(".") if p] for _, _, module in triples}
    deepest = max(map(len, parts.values()), default=0)
    for depth in range(deepest, 0, -1):
        prefix = {module: truncate_module(module, depth) for module in parts}
        groups = {(gid, phase, prefix[module]) for gid, phase, module in triples}
        if len(groups) <= max_nodes:
            return depth
    return 0


def build_view(profile: Profile, stat: str = "median", module_level: bool | None = None, hide_views: bool = False,
               max_nodes: int = 600, bounds: Mapping[Any, str] | None = None) -> GraphView:
    """The picture's content under the options above (see the module docstring)."""
    op_nodes = profile.node_count
    collapse = op_nodes > max_nodes if module_level is None else module_level
    multi = len(profile.graphs) > 1
    if collapse:  # from edge arrays and the node frame: no networkx graph of every op
        return _module_view(profile, stat, max_nodes, multi, op_nodes)
    dags = [(g, dataflow_graph(g, stat=stat)) for g in profile.graphs]
    paths = {g.id: critical_path(dag, stat=stat) for g, dag in dags}
    total = sum(cp.serial_s for cp in paths.values())
    nodes: list[ViewNode] = []
    edges: list[ViewEdge] = []
    hidden = 0
    for graph, dag in dags:
        cp = paths[graph.id]
        records = {n.id: n for n in graph.nodes}
        work = dag.copy()
        if hide_views:
            for nid in [n.id for n in graph.nodes if is_hideable(n)]:
                for p in list(work.predecessors(nid)):
                    for s in list(work.successors(nid)):
                        kind = EdgeKind.DATA if (work.edges[p, nid]["kind"] == EdgeKind.DATA
                                                 and work.edges[nid, s]["kind"] == EdgeKind.DATA) else EdgeKind.ORDER
                        if not work.has_edge(p, s) or kind == EdgeKind.DATA:
                            work.add_edge(p, s, kind=kind)
                work.remove_node(nid)
                hidden += 1
        shown_path = [n for n in cp.nodes if n in work]
        path_edges = set(zip(shown_path, shown_path[1:]))
        on_path = set(shown_path)
        prefix = (graph.name or f"graph {graph.id}",) if multi else ()
        for nid in work.nodes:
            node, t = records[nid], work.nodes[nid]["time_s"]
            parts = [p for p in node.module.split(".") if p]
            cluster = prefix + (node.phase.value,) + tuple(".".join(parts[: i + 1]) for i in range(len(parts)))
            nodes.append(ViewNode(
                key=f"n{graph.id}_{nid}", title=node.type or node.op, subtitle="", time_s=t,
                share=t / total if total > 0 else 0.0, flops=node.flops, bound=bound_of(bounds, graph.id, nid),
                cluster=cluster, tooltip=_node_tooltip(node, t), critical=nid in on_path, members=1))
        for a, b, kind in work.edges(data="kind"):
            edges.append(ViewEdge(f"n{graph.id}_{a}", f"n{graph.id}_{b}", kind, (a, b) in path_edges,
                                  cross_phase=work.nodes[a]["phase"] != work.nodes[b]["phase"]))
        edges.extend(_layout_edges(graph.id, [n.id for n in graph.nodes if n.id in work], work))
    return GraphView(tuple(nodes), tuple(edges), False, None, total,
                     sum(cp.length_s for cp in paths.values()), total, hidden, stat, op_nodes)


def _layout_edges(graph_id: int, order: list[int], work: nx.DiGraph) -> list[ViewEdge]:
    """Invisible edges that keep loosely tied ops near where they run.

    Graphviz ranks a source op (``empty``, a BatchNorm's ``num_batches_tracked
    += 1``, an optimizer's ``momentum_buffer.mul_``) at the top, and a
    backward op whose only input is a forward activation (the ``detach`` of a
    saved tensor) right under the forward op; either stretches its cluster
    over the whole picture. Such an op (no input from its own phase) is placed
    level with its first consumer's other inputs of that phase (the momentum
    buffer beside the gradient it is added to); one without consumers right
    after the op run before it.
    """
    phase = {n: work.nodes[n].get("phase") for n in work}
    edges: list[ViewEdge] = []
    for prev, nid in zip(order, order[1:]):
        if any(phase[p] == phase[nid] for p in work.predecessors(nid)):
            continue
        consumers = sorted(work.successors(nid), key=lambda s: work.nodes[s].get("position", s))
        anchors = ([p for p in work.predecessors(consumers[0]) if p != nid and phase[p] == phase[nid]]
                   if consumers else [])
        for anchor in anchors or [prev]:
            edges.append(ViewEdge(f"n{graph_id}_{anchor}", f"n{graph_id}_{nid}", EdgeKind.ORDER, False,
                                  layout_only=True))
    return edges


def _successors(graph: GraphRecord, edges: EdgeArrays) -> list[list[int]]:
    """Per position, the destinations of its edges in the dataflow graph's adjacency order (data, then order)."""
    succ: list[list[int]] = [[] for _ in range(graph_size(graph))]
    for src, dst in edges.data:
        succ[src].append(dst)
    for src, dst in edges.order:
        succ[src].append(~dst)  # ~dst: an ordering edge
    return succ


def _module_view(profile: Profile, stat: str, max_nodes: int, multi: bool, op_nodes: int) -> GraphView:
    depth = _choose_depth(profile, min(max_nodes, MODULE_LEVEL_BOXES))
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    col = frame.column
    spans = graph_spans(profile, frame)
    edges_of: dict[int, EdgeArrays] = {}
    paths = {}
    for graph, lo, hi in spans:
        edges_of[graph.id] = edge_arrays(graph)
        paths[graph.id] = graph_critical_path(graph, times[lo:hi], stat, edges_of[graph.id])
    total = sum(cp.serial_s for cp in paths.values())
    prefix_of: dict[str, str] = {}
    info: dict[tuple[int, str, str], dict[str, Any]] = {}
    groups_of: list[tuple[list[str], dict[int, str]]] = []  # per graph: each position's group, each node id's
    for graph, lo, hi in spans:
        prefix = (graph.name or f"graph {graph.id}",) if multi else ()
        keys: list[str] = []
        for module, phase, flops, module_type, t in zip(col("module")[lo:hi], col("phase")[lo:hi],
                                                        col("flops")[lo:hi], col("module_type")[lo:hi], times[lo:hi]):
            shown = prefix_of.get(module)
            if shown is None:
                shown = prefix_of[module] = truncate_module(module, depth)
            ident = (graph.id, phase, shown)
            entry = info.get(ident)
            if entry is None:
                entry = info[ident] = {"key": f"g{graph.id}_{phase}_{len(info)}", "module": shown, "types": {},
                                       "time": 0.0, "flops": 0, "flops_known": True, "count": 0,
                                       "cluster": prefix + (phase,)}
            keys.append(entry["key"])
            entry["time"] += t
            entry["count"] += 1
            if flops is None:
                entry["flops_known"] = False
            else:
                entry["flops"] += flops
            if module and module == shown:
                entry["types"][module_type] = None
        # A node's group by its id (of a repeated id, the last node's, as a mapping by id keeps it).
        by_id = dict(zip(col("id")[lo:hi], keys))
        groups_of.append(([by_id[nid] for nid in col("id")[lo:hi]], by_id))
    crit_groups: set[str] = set()
    crit_edges: set[tuple[str, str]] = set()
    edges: dict[tuple[str, str], EdgeKind] = {}
    for (graph, _, _), (groups, by_id) in zip(spans, groups_of):
        seq = [by_id[n] for n in paths[graph.id].nodes]
        crit_groups.update(seq)
        crit_edges.update((a, b) for a, b in zip(seq, seq[1:]) if a != b)
        for src, targets in enumerate(_successors(graph, edges_of[graph.id])):
            ga = groups[src]
            for dst in targets:
                gb = groups[dst if dst >= 0 else ~dst]
                if ga != gb and edges.get((ga, gb)) != EdgeKind.DATA:
                    edges[(ga, gb)] = EdgeKind.DATA if dst >= 0 else EdgeKind.ORDER
    nodes = []
    for entry in info.values():
        module = entry["module"] or TOP_LEVEL
        types = ", ".join(t for t in entry["types"] if t)
        flops = entry["flops"] if entry["flops_known"] else None
        subtitle = f"{types + ' · ' if types else ''}{entry['count']} op{'s' if entry['count'] != 1 else ''}"
        tooltip = (f"{module} ({entry['cluster'][-1]})\n{subtitle}\ntime: {format_time(entry['time'])}\n"
                   f"FLOPs: {format_count(flops, 'FLOP')}")
        nodes.append(ViewNode(key=entry["key"], title=module, subtitle=subtitle, time_s=entry["time"],
                              share=entry["time"] / total if total > 0 else 0.0, flops=flops, bound=None,
                              cluster=entry["cluster"], tooltip=tooltip, critical=entry["key"] in crit_groups,
                              members=entry["count"]))
    phase_of = {entry["key"]: entry["cluster"][-1] for entry in info.values()}
    view_edges = tuple(ViewEdge(a, b, k, (a, b) in crit_edges, cross_phase=phase_of[a] != phase_of[b])
                       for (a, b), k in edges.items())
    return GraphView(tuple(nodes), view_edges, True, depth, total,
                     sum(cp.length_s for cp in paths.values()), total, 0, stat, op_nodes)
