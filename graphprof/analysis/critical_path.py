"""The critical path of a graph's dataflow DAG, weighted by measured time.

The critical path is the chain of dependent nodes whose times add up to the
most: no schedule of the graph, however parallel, can finish sooner. Its
length against the serial sum (what one in-order stream takes) says how much
a step could gain from running independent ops concurrently (streams, more
threads, a fusing compiler): a ratio near 1 means the graph is a chain and
only faster ops help.

Unlike HTA's critical path, which is built from kernel launches and stream
order, this one follows the real tensor dependencies (``analysis.dataflow``),
ordering edges for in-place writes included.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from graphprof.analysis.dataflow import EdgeArrays, EdgeIndex, EdgeKind, edge_arrays, edge_index_arrays, frame_writes, sorted_isin
from graphprof.analysis.node_time import node_times_s
from graphprof.analysis.frame import graph_column, node_frame
from graphprof.analysis.node_arrays import graph_spans
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, Profile

if TYPE_CHECKING:  # networkx is imported only to analyse a networkx graph given by the caller
    import networkx as nx


@dataclass(frozen=True)
class CriticalPath:
    """The longest path of one graph, node-weighted by time under ``stat``.

    ``nodes`` are node ids in execution order; ``edge_kinds`` names, for each
    consecutive pair, whether data or an in-place ordering links them.
    ``ratio`` is ``length_s / serial_s`` (0 for a graph without time).
    """

    graph_id: int
    stat: str
    nodes: tuple[int, ...]
    edge_kinds: tuple[EdgeKind, ...]
    length_s: float
    serial_s: float
    ratio: float

    @property
    def node_set(self) -> frozenset[int]:
        return frozenset(self.nodes)


def longest_path(dag: nx.DiGraph, weight: str = "time_s") -> tuple[list[int], float]:
    """Node-weighted longest path of a DAG whose nodes carry ``weight``.

    Dynamic programming in topological order (ties broken towards the
    earliest ``position``, so the answer is deterministic). O(V + E).
    """
    import networkx as nx

    positions = dict(dag.nodes(data="position"))
    if all(p is not None for p in positions.values()) and all(positions[a] < positions[b] for a, b in dag.edges):
        # Every edge points forward in execution order (graphprof's dataflow graphs):
        # that order is topological, and acyclic by construction.
        order = sorted(dag.nodes, key=positions.__getitem__)
    else:
        if not nx.is_directed_acyclic_graph(dag):
            raise ValueError("the dataflow graph has a cycle, so it has no critical path")
        order = list(nx.lexicographical_topological_sort(dag, key=lambda n: dag.nodes[n].get("position", n)))
    best: dict[int, float] = {}
    prev: dict[int, int | None] = {}
    for n in order:
        w = float(dag.nodes[n].get(weight) or 0.0)
        parent, parent_len = None, 0.0
        for p in dag.predecessors(n):
            if parent is None or best[p] > parent_len:
                parent, parent_len = p, best[p]
        best[n] = parent_len + w
        prev[n] = parent
    if not best:
        return [], 0.0
    end = max(order, key=lambda n: best[n])  # max() keeps the first of equals
    path = [end]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])  # type: ignore[arg-type]
    path.reverse()
    return path, best[end]


def _longest_in_order(times: Sequence[float], preds: list[list[int]]) -> tuple[list[int], float]:
    """``longest_path`` over positions whose edges all point forward (so position order is topological)."""
    best: list[float] = []
    prev: list[int] = []
    for n, w in enumerate(times):
        parent, parent_len = -1, 0.0
        for p in preds[n]:
            if parent < 0 or best[p] > parent_len:
                parent, parent_len = p, best[p]
        best.append(parent_len + float(w or 0.0))
        prev.append(parent)
    return _trace_back(best, prev)


def _trace_back(best: list[float], prev: list[int]) -> tuple[list[int], float]:
    if not best:
        return [], 0.0
    end = max(range(len(best)), key=best.__getitem__)  # max() keeps the first of equals
    path = [end]
    while prev[path[-1]] >= 0:
        path.append(prev[path[-1]])
    path.reverse()
    return path, best[end]


def _longest_by_index(weights: list[float], edges: EdgeIndex) -> tuple[np.ndarray, float]:
    """``_longest_in_order`` over an ``EdgeIndex``: the same path (as an array of positions) and length,
    predecessors read from arrays.

    Each node's predecessors are its data sources then its ORDER sources,
    each in edge order, as ``EdgeArrays.predecessors`` lists them (the first
    of equally long predecessors wins, so the order decides ties).

    Why runs: most nodes of a training step have one predecessor, the node
    just before them. Over a run of such nodes the longest path only adds
    their weights one after another, which ``itertools.accumulate`` does in C
    with the same additions in the same order (so the same floats); the loop
    in Python visits only the nodes that start a run, and only their edges
    are made Python lists.
    """
    size = len(weights)
    if not size:
        return np.zeros(0, dtype=np.intp), 0.0
    dst = np.concatenate((edges.data_dst, edges.order_dst))
    by_dst = np.argsort(dst, kind="stable")
    src_arr = np.concatenate((edges.data_src, edges.order_src))[by_dst]
    counts = np.bincount(dst, minlength=size)
    follows = counts == 1  # one predecessor, and it is the node just before
    follows[follows] = src_arr[(np.cumsum(counts) - counts)[follows]] == np.flatnonzero(follows) - 1
    heads = np.flatnonzero(~follows)
    # The heads' predecessors alone, in one list: head k's are srcs[bounds[k]:bounds[k + 1]].
    srcs = src_arr[np.repeat(~follows, counts)].tolist()
    bounds = np.concatenate(([0], np.cumsum(counts[heads]))).tolist()
    run_ends = np.append(heads[1:], size).tolist()
    best: list[float] = [0.0] * size
    prev: dict[int, int] = {}  # a head's predecessor on its longest path (-1: none)
    for k, (n, run_end) in enumerate(zip(heads.tolist(), run_ends)):
        start, end = bounds[k], bounds[k + 1]
        if end == start:
            parent, parent_len = -1, 0.0
        else:
            parent = srcs[start]
            parent_len = best[parent]
            for j in range(start + 1, end):
                p = srcs[j]
                if best[p] > parent_len:
                    parent, parent_len = p, best[p]
        prev[n] = parent
        if run_end == n + 1:
            best[n] = parent_len + weights[n]
        else:
            best[n:run_end] = itertools.accumulate(weights[n + 1:run_end], initial=parent_len + weights[n])
    best_arr = np.fromiter(best, dtype=np.float64, count=size)
    end = int(np.argmax(best_arr))  # the first of equals, as max() in _trace_back
    # Back from the end: within a run the path is every node down to the run's head, then the head's parent.
    head_of = np.maximum.accumulate(np.where(follows, 0, np.arange(size)))
    pieces = []
    node = end
    while node >= 0:
        head = int(head_of[node])
        pieces.append(np.arange(head, node + 1))
        node = prev[head]
    return np.concatenate(pieces[::-1]), best[end]


def _weights(times: Sequence[float]) -> list[float]:
    """``float(t or 0.0)`` of every time (None and -0.0 are 0.0; NaN stays), through numpy when none is None."""
    if None in times:
        return [float(t or 0.0) for t in times]
    out = np.array(times, dtype=np.float64)
    out[out == 0.0] = 0.0
    return out.tolist()  # type: ignore[no-any-return]


def _record_path(graph: GraphRecord, times: Sequence[float], stat: str, edges: EdgeArrays | None = None) -> CriticalPath:
    """The critical path of a graph record from its edge arrays: no networkx graph is built."""
    edges = edge_arrays(graph) if edges is None else edges
    path, length = _longest_in_order(times, edges.predecessors(len(times)))
    serial = sum(float(t or 0.0) for t in times)
    data = set(edges.data)
    kinds = tuple(EdgeKind.DATA if e in data else EdgeKind.ORDER for e in zip(path, path[1:]))
    ids = graph_column(graph, "id")  # a loaded graph builds no record
    return CriticalPath(
        graph_id=graph.id, stat=stat, nodes=tuple(ids[i] for i in path), edge_kinds=kinds,
        length_s=length, serial_s=serial, ratio=length / serial if serial > 0 else 0.0,
    )


def _frame_path(graph_id: int, ids: Sequence[int], times: Sequence[float], stat: str,
                edges: EdgeIndex) -> CriticalPath:
    """``_record_path`` from a graph's columns and ``EdgeIndex``."""
    weights = _weights(times)
    path, length = _longest_by_index(weights, edges)
    serial = sum(weights)
    size = len(times)
    kinds: tuple[EdgeKind, ...] = ()
    if len(path) > 1:
        # Consecutive nodes of the path are linked by an edge: a data edge, else an ORDER edge. Only
        # the pairs that are ORDER edges (few or none) are looked up among the data edges.
        linked = path[:-1].astype(np.int64) * size + path[1:]
        order_keys = np.sort(edges.order_src.astype(np.int64) * size + edges.order_dst)
        maybe_order = np.flatnonzero(sorted_isin(linked, order_keys)) if len(order_keys) else np.zeros(0, np.intp)
        steps = [EdgeKind.DATA] * (len(path) - 1)
        if len(maybe_order):
            data_keys = np.sort(edges.data_src.astype(np.int64) * size + edges.data_dst)
            for i in maybe_order[~sorted_isin(linked[maybe_order], data_keys)].tolist():
                steps[i] = EdgeKind.ORDER
        kinds = tuple(steps)
    return CriticalPath(
        graph_id=graph_id, stat=stat, nodes=tuple(map(ids.__getitem__, path.tolist())), edge_kinds=kinds,
        length_s=length, serial_s=serial, ratio=length / serial if serial > 0 else 0.0,
    )


def critical_path(graph: GraphRecord | nx.DiGraph, stat: str = "median") -> CriticalPath:
    """The critical path of a graph record (or of a dataflow graph built from one)."""
    if isinstance(graph, GraphRecord):
        stat_fn(stat)  # a bad statistic fails here, with the list of valid ones
        return _record_path(graph, node_times_s(graph.nodes, stat), stat)
    dag = graph
    path, length = longest_path(dag)
    serial = sum(float(t or 0.0) for _, t in dag.nodes(data="time_s"))
    kinds = tuple(dag.edges[a, b]["kind"] for a, b in zip(path, path[1:]))
    return CriticalPath(
        graph_id=int(dag.graph.get("graph_id", 0)), stat=str(dag.graph.get("stat", stat)),
        nodes=tuple(path), edge_kinds=kinds, length_s=length, serial_s=serial,
        ratio=length / serial if serial > 0 else 0.0,
    )


def critical_paths(profile: Profile, stat: str = "median") -> tuple[CriticalPath, ...]:
    """One critical path per graph of the profile, in graph order.

    Graphs of a step run one after another, so a step's critical path is the
    concatenation of these and its length their sum. Read from the node
    frame's columns: no node record is needed.
    """
    return tuple(path for path, _ in paths_and_edges(profile, stat))


def paths_and_edges(profile: Profile, stat: str = "median") -> list[tuple[CriticalPath, EdgeIndex]]:
    """Each graph's critical path with the ``EdgeIndex`` it was found on (positions within the graph).

    For views that walk every edge as well (the GraphML, node-link and DOT
    exports): one edge pass instead of two, a tenth of a second on 100,000 nodes.
    """
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    ids = frame.column("id")
    id_arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
    flat, offsets = frame.input_arrays()  # not the inputs column: no tuple per node
    lens = np.diff(offsets)
    writes, aliases = frame_writes(frame)
    out = []
    for graph, (start, end) in zip(profile.graphs, graph_spans(profile, frame)):
        edges = edge_index_arrays(id_arr[start:end], flat[offsets[start]:offsets[end]], lens[start:end],
                                  writes[start:end], aliases[start:end])
        out.append((_frame_path(graph.id, ids[start:end], times[start:end], stat, edges), edges))
    return out
