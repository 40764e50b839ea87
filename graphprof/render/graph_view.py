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
from itertools import compress
from typing import TYPE_CHECKING

import numpy as np

from graphprof.analysis.aggregate import truncate_module
from graphprof.analysis.critical_path import CriticalPath, critical_path, paths_and_edges
from graphprof.analysis.dataflow import EdgeIndex, EdgeKind, dataflow_graph
from graphprof.analysis.entries import bytes_moved
from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import codes, column_codes
from graphprof.profile.model import NodeRecord, Profile
from graphprof.render.export_options import Bounds
from graphprof.render.labels import bound_of, shapes_text
from graphprof.render.node_columns import adjacency_arrays, graph_spans
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


def _node_tooltip(node: NodeRecord, time_s: float) -> str:
    lines = [f"{node.name}: {node.op}", f"module: {node.module or TOP_LEVEL} ({node.module_type or '-'})",
             f"source: {node.source or '-'}", f"in: {shapes_text(node.in_shapes, limit=6)}",
             f"out: {shapes_text(node.out_shapes, limit=6)}", f"time: {format_time(time_s)}",
             f"FLOPs: {format_count(node.flops, 'FLOP')}",
             f"bytes: {format_bytes(bytes_moved(node.bytes_read, node.bytes_written))}"]
    if node.scope:
        lines.append(f"scope: {node.scope}")
    return "\n".join(lines)


def _choose_depth(profile: Profile, max_nodes: int) -> int:
    """The deepest module depth whose (graph, phase, module prefix) groups fit in ``max_nodes`` boxes.

    Counted on codes: each distinct module's prefix is made once per depth
    and the groups are distinct integers. A deeper prefix only splits groups,
    so their number grows with the depth: counting from depth 1 up stops at
    the first depth that does not fit, instead of trying every depth from the deepest down.
    """
    frame = node_frame(profile)
    graph_codes, _ = column_codes(frame, "graph_id")
    phase_codes, phases = column_codes(frame, "phase")
    module_codes, modules = column_codes(frame, "module")
    place = (graph_codes * len(phases) + phase_codes) * len(modules)  # a (graph, phase) pair's first group number
    pairs = np.unique(place + module_codes)  # each (graph, phase, module) once: groups are counted on these
    pair_module = pairs % max(len(modules), 1)
    pair_place = pairs - pair_module
    parts = [str(module).split(".") for module in modules]
    deepest = max((len(split) - split.count("") for split in parts), default=0)
    chosen = 0
    for depth in range(1, deepest + 1):
        prefix, _ = codes([".".join(split[:depth]) for split in parts])  # truncate_module of each distinct module
        if len(np.unique(pair_place + prefix[pair_module])) > max_nodes:
            break
        chosen = depth
    return chosen


def draws_modules(profile: Profile, module_level: bool | None, max_nodes: int) -> bool:
    """Whether ``build_view`` draws module groups (which show no roofline bound) rather than op nodes."""
    return profile.node_count > max_nodes if module_level is None else module_level


def build_view(profile: Profile, stat: str = "median", module_level: bool | None = None, hide_views: bool = False,
               max_nodes: int = 600, bounds: Bounds | None = None) -> GraphView:
    """The picture's content under the options above (see the module docstring)."""
    op_nodes = profile.node_count
    collapse = draws_modules(profile, module_level, max_nodes)
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


@dataclass(frozen=True)
class _ModuleBox:
    """One box of a module-level picture: a (graph, phase, module prefix) group of op nodes.

    ``types``: the module types of the nodes whose module is the prefix itself, in first-seen order;
    ``flops``: None when any node of the group has no FLOP count; ``cluster``: graph name (when several) and phase.
    """

    key: str
    module: str
    types: tuple[str, ...]
    time_s: float
    flops: int | None
    count: int
    cluster: tuple[str, ...]


def _module_groups(profile: Profile, depth: int, multi: bool,
                   times: list[float]) -> tuple[list[_ModuleBox], np.ndarray]:
    """The module boxes (one per graph, phase and module prefix at ``depth``, in order of their first
    node) and each node's box (an index into them), from the node frame's codes.

    Why codes: a Python loop over 100,000 nodes was most of a module-level
    picture's time, and so was finding the distinct (graph, phase, prefix)
    tuples of every node; each is a number made from three codes here. Times
    are summed per box in node order (``np.bincount`` adds in input order, as
    a running sum did), FLOPs as Python ints.
    """
    frame = node_frame(profile)
    col = frame.column
    graph_codes, graph_ids = column_codes(frame, "graph_id")
    phase_codes, phases = column_codes(frame, "phase")
    module_codes, modules = column_codes(frame, "module")
    shown_of = [truncate_module(str(m), depth) for m in modules]
    shown_codes, shown = codes(shown_of)
    key = (graph_codes * len(phases) + phase_codes) * max(len(shown), 1) + shown_codes[module_codes]
    distinct, first_at, inverse = np.unique(key, return_index=True, return_inverse=True)
    by_first = np.argsort(first_at, kind="stable")  # boxes in order of their first node
    rank = np.empty(len(distinct), dtype=np.intp)
    rank[by_first] = np.arange(len(distinct), dtype=np.intp)
    box = rank[inverse.reshape(-1)]
    size = len(distinct)
    first = first_at[by_first].tolist()
    time_s = np.bincount(box, weights=np.asarray(times, dtype=np.float64), minlength=size).tolist()
    count = np.bincount(box, minlength=size).tolist()
    flops_col = col("flops")
    unknown = np.bincount(box[np.fromiter((f is None for f in flops_col), dtype=bool, count=len(box))],
                          minlength=size).tolist()
    flops = np.zeros(size, dtype=object)
    np.add.at(flops, box, np.array([0 if f is None else f for f in flops_col], dtype=object))
    own = [bool(m) and m == s for m, s in zip(modules, shown_of)]  # nodes of the box's own module name its types
    types: list[dict[str, None]] = [{} for _ in range(size)]
    mine = np.array(own, dtype=bool)[module_codes] if own else np.zeros(0, dtype=bool)
    for k, module_type in dict.fromkeys(zip(box[mine].tolist(), compress(col("module_type"), mine.tolist()))):
        types[k][module_type] = None
    graph_index = col("graph_index")
    info: list[_ModuleBox] = []
    for k, i in enumerate(first):
        gid, phase = graph_ids[graph_codes[i]], phases[phase_codes[i]]
        graph = profile.graphs[graph_index[i]]
        info.append(_ModuleBox(f"g{gid}_{phase}_{k}", shown[shown_codes[module_codes[i]]], tuple(types[k]), time_s[k],
                               None if unknown[k] else int(flops[k]), count[k],
                               ((graph.name or f"graph {graph.id}",) if multi else ()) + (phase,)))
    return info, box


def _box_edges(edges: EdgeIndex, boxes: np.ndarray) -> list[tuple[int, int, bool]]:
    """The edges between different boxes (``boxes``: each position's box): (from, to, whether any op edge
    between them is a data edge), in the order their first op edge comes in the dataflow graph's adjacency."""
    src, dst, is_order = adjacency_arrays(edges)
    a, b = boxes[src], boxes[dst]
    apart = a != b
    pair = a[apart] * (int(boxes.max(initial=0)) + 1) + b[apart]
    distinct, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    any_data = np.bincount(inverse.reshape(-1), weights=~is_order[apart], minlength=len(distinct)) > 0
    order = np.argsort(first, kind="stable")
    return list(zip(a[apart][first[order]].tolist(), b[apart][first[order]].tolist(), any_data[order].tolist()))


def _module_view(profile: Profile, stat: str, max_nodes: int, multi: bool, op_nodes: int) -> GraphView:
    depth = _choose_depth(profile, min(max_nodes, MODULE_LEVEL_BOXES))
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    col = frame.column
    spans = graph_spans(profile, frame)
    edges_of: dict[int, EdgeIndex] = {}
    paths: dict[int, CriticalPath] = {}
    for (graph, _, _), (path, graph_edges) in zip(spans, paths_and_edges(profile, stat)):
        edges_of[graph.id] = graph_edges
        paths[graph.id] = path
    total = sum(cp.serial_s for cp in paths.values())
    info, box = _module_groups(profile, depth, multi, times)
    key_of = [entry.key for entry in info]
    crit_groups: set[str] = set()
    crit_edges: set[tuple[str, str]] = set()
    edges: dict[tuple[str, str], EdgeKind] = {}
    for graph, lo, hi in spans:
        ids = col("id")[lo:hi]
        boxes = box[lo:hi]
        # A node's group by its id (of a repeated id, the last node's, as a mapping by id keeps it).
        by_id = dict(zip(ids, boxes.tolist()))
        if len(by_id) < hi - lo:
            boxes = np.fromiter(map(by_id.__getitem__, ids), dtype=np.intp, count=hi - lo)
        seq = [key_of[by_id[n]] for n in paths[graph.id].nodes]
        crit_groups.update(seq)
        crit_edges.update((a, b) for a, b in zip(seq, seq[1:]) if a != b)
        for a, b, data in _box_edges(edges_of[graph.id], boxes):
            edges[(key_of[a], key_of[b])] = EdgeKind.DATA if data else EdgeKind.ORDER
    nodes = []
    for entry in info:
        module = entry.module or TOP_LEVEL
        types = ", ".join(t for t in entry.types if t)
        flops = entry.flops
        subtitle = f"{types + ' · ' if types else ''}{entry.count} op{'s' if entry.count != 1 else ''}"
        tooltip = (f"{module} ({entry.cluster[-1]})\n{subtitle}\ntime: {format_time(entry.time_s)}\n"
                   f"FLOPs: {format_count(flops, 'FLOP')}")
        nodes.append(ViewNode(key=entry.key, title=module, subtitle=subtitle, time_s=entry.time_s,
                              share=entry.time_s / total if total > 0 else 0.0, flops=flops, bound=None,
                              cluster=entry.cluster, tooltip=tooltip, critical=entry.key in crit_groups,
                              members=entry.count))
    phase_of = {entry.key: entry.cluster[-1] for entry in info}
    view_edges = tuple(ViewEdge(a, b, k, (a, b) in crit_edges, cross_phase=phase_of[a] != phase_of[b])
                       for (a, b), k in edges.items())
    return GraphView(tuple(nodes), view_edges, True, depth, total,
                     sum(cp.length_s for cp in paths.values()), total, 0, stat, op_nodes)
