"""The dataflow graph of a captured graph, as a ``networkx.DiGraph``.

Nodes are the ``NodeRecord`` ids of one ``GraphRecord``; every node carries
its record's fields as plain attributes plus ``time_s`` (its time under the
chosen statistic). Edges are of two kinds (``EdgeKind``):

- ``DATA``: producer → consumer, from ``NodeRecord.inputs``.
- ``ORDER``: an in-place write must stay after the earlier readers of the
  tensor it writes and before the later ones, although no data flows along
  those edges. Without them a critical path could run a reader "in parallel"
  with the op that overwrites what it reads.

The in-place rule, with only node-level facts at hand (a profile records
which op produced each input, not which argument an op writes):

1. A node *writes in place* when its op type ends in ``_`` (``add_``,
   ``mul_``, ``addcdiv_``, ``_foreach_add_``), dunder Python operators
   (``__and__``) excepted.
2. Storage is shared through aliases: a view (``is_view``), a tuple
   projection (``getitem``) or an in-place writer shares storage with all of
   its inputs. Alias classes are the connected components of that relation.
   Since we cannot tell which argument a writer writes, every input counts as
   written: a sound over-approximation (extra edges can only lengthen the
   critical path, never hide a dependency).
3. Readers of a class are the nodes with an input in it. Walking them in
   execution order, each writer gets an ORDER edge from every reader since
   the previous writer, and an edge to every reader up to (and including)
   the next writer. Through the chain of writers this orders *every* earlier
   reader before a write and every later reader after it, with O(readers)
   edges instead of O(readers × writers).

Limits: tensors that no op produced (parameters, optimizer state held by the
user) have no node, so two writers of the same parameter with no op-produced
input in common are not ordered; ``out=`` variants are not recognised as
writers. Data edges that would point backwards in execution order (only a
hand-edited profile has them) are dropped, so the result is always a DAG.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from graphprof.analysis.frame import NodeFrame, graph_column, graph_input_arrays
from graphprof.analysis.node_arrays import column_codes, column_mask
from graphprof.analysis.node_time import node_time_s
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, NodeRecord

if TYPE_CHECKING:  # networkx is imported where a graph is built: the report and critical path never need it
    import networkx as nx


class EdgeKind(str, enum.Enum):
    """Why an edge of the dataflow graph exists."""

    DATA = "data"
    ORDER = "order"


@dataclass(frozen=True)
class DataflowEdge:
    """One edge: ``src`` must finish before ``dst`` starts."""

    src: int
    dst: int
    kind: EdgeKind


def is_inplace_write(node: NodeRecord) -> bool:
    """True for ops that write one of their inputs (rule 1 above): the annotate pass's ``is_inplace``.

    A record that does not say (``is_inplace`` None: a file written before
    the field, a hand-made record) is read by aten's naming rule, a trailing
    ``_`` (``add_``, not a dunder).
    """
    if node.is_inplace is not None:
        return node.is_inplace
    op_type = node.type
    return op_type.endswith("_") and not op_type.endswith("__")


@dataclass(frozen=True)
class EdgeArrays:
    """A graph's dataflow edges as (source, destination) positions in execution order.

    Why positions and plain lists: the critical path of a 100,000-node graph
    needs only these, and building a networkx graph (or one record per edge)
    of that size took seconds. ``data`` come first in node order, ``order``
    after them; every edge points forward (source position < destination).
    """

    data: list[tuple[int, int]]
    order: list[tuple[int, int]]

    def predecessors(self, size: int) -> list[list[int]]:
        """The sources of each position's incoming edges, data edges first, each kind in edge order."""
        preds: list[list[int]] = [[] for _ in range(size)]
        for src, dst in self.data:
            preds[dst].append(src)
        for src, dst in self.order:
            preds[dst].append(src)
        return preds


@dataclass(frozen=True)
class EdgeIndex:
    """The same edges as ``EdgeArrays``, as numpy arrays (what the critical path of a big graph reads)."""

    data_src: np.ndarray
    data_dst: np.ndarray
    order_src: np.ndarray
    order_dst: np.ndarray

    def lists(self) -> EdgeArrays:
        return EdgeArrays(list(zip(self.data_src.tolist(), self.data_dst.tolist())),
                          list(zip(self.order_src.tolist(), self.order_dst.tolist())))


def inplace_writes(is_inplace: Sequence[bool | None], types: Sequence[str]) -> list[bool]:
    """``is_inplace_write`` of each node, from its ``is_inplace`` and ``type`` columns."""
    return [flag if flag is not None else (t.endswith("_") and not t.endswith("__"))
            for flag, t in zip(is_inplace, types)]


def _writes_by_name(op_type: str) -> bool:
    return op_type.endswith("_") and not op_type.endswith("__")


def frame_writes(frame: NodeFrame) -> tuple[np.ndarray, np.ndarray]:
    """``is_inplace_write`` of every node of a frame, and whether it aliases its inputs (a view, a
    ``getitem`` or a writer): judged once per distinct type, ``is_inplace`` and ``is_view`` value."""
    def build() -> tuple[np.ndarray, np.ndarray]:
        flag_codes, flags = column_codes(frame, "is_inplace")
        said = np.array([f is not None for f in flags], dtype=bool)[flag_codes] if flags else np.zeros(0, bool)
        said_true = np.array([bool(f) for f in flags], dtype=bool)[flag_codes] if flags else np.zeros(0, bool)
        writes = np.where(said, said_true, column_mask(frame, "type", _writes_by_name))
        aliases = writes | column_mask(frame, "is_view", bool) | column_mask(frame, "type", lambda t: t == "getitem")
        writes.flags.writeable = aliases.flags.writeable = False
        return writes, aliases
    return frame.memo("frame_writes", build)


def positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The position of each wanted id among ``ids`` (the last one of equal ids), -1 where none has it."""
    n = len(ids)
    if n and ids[0] == 0 and ids[-1] == n - 1 and np.array_equal(ids, np.arange(n)):
        return np.where((wanted >= 0) & (wanted < n), wanted, -1)
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    k = np.searchsorted(ordered, wanted, side="right") - 1
    safe = np.maximum(k, 0)
    found = (k >= 0) & (ordered[safe] == wanted) if n else np.zeros(len(wanted), dtype=bool)
    return np.where(found, order[safe] if n else -1, -1)


def _alias_classes(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The connected component of each position under edges (a, b), named by its smallest position.

    Hooking and pointer jumping over arrays; each round at least halves the
    distance to a component's smallest member, so rounds are few.
    """
    label = np.arange(n)
    while len(a):
        la, lb = label[a], label[b]
        low = np.minimum(la, lb)
        hooked = label.copy()
        np.minimum.at(hooked, la, low)
        np.minimum.at(hooked, lb, low)
        while True:
            jumped = hooked[hooked]
            if np.array_equal(jumped, hooked):
                break
            hooked = jumped
        if np.array_equal(hooked, label):
            break
        label = hooked
    return label


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of an integer array, ascending.

    Why not ``np.unique``: its hash table took most of a second on a million
    distinct ids (a sort takes a few hundredths), and it imports ``numpy.ma``.
    """
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def sorted_isin(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``ordered`` (ascending): ``np.isin`` by binary search."""
    if not len(ordered):
        return np.zeros(len(values), dtype=bool)
    k = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return ordered[k] == values


def edge_index_arrays(id_arr: np.ndarray, flat: np.ndarray, lens: np.ndarray, writes: Sequence[bool] | np.ndarray,
                      aliases: Sequence[bool] | np.ndarray) -> EdgeIndex:
    """DATA and ORDER edges (rules 1 to 3 above) of one graph's nodes, given as arrays: node ids
    (int64), every node's input ids in one int64 array, and how many inputs each node has.
    ``writes``: ``is_inplace_write`` per node; ``aliases``: whether the node shares storage with its
    inputs (a view, a ``getitem`` or a writer).

    Data edges and the alias classes are array operations; the ORDER edges
    walk only the readers of classes that are written.
    """
    n = len(id_arr)
    dst = np.repeat(np.arange(n), lens)
    pos = positions(id_arr, flat)
    keep = (pos >= 0) & (pos < dst)
    multi = np.flatnonzero(lens[dst] >= 2)  # a node's repeated input counts once, at its first place
    if len(multi):
        by = multi[np.lexsort((multi, flat[multi], dst[multi]))]
        repeat = (dst[by][1:] == dst[by][:-1]) & (flat[by][1:] == flat[by][:-1])
        keep[by[1:][repeat]] = False
    src, dst = pos[keep], dst[keep]
    empty = np.zeros(0, dtype=np.intp)
    write_arr = np.asarray(writes, dtype=bool)
    if not write_arr[dst].any():  # no writer with a producer before it: no ORDER edge
        return EdgeIndex(src, dst, empty, empty)
    order = _order_edges(n, id_arr, src, dst, write_arr, np.asarray(aliases, dtype=bool))
    order_arr = np.array(order, dtype=np.intp).reshape(-1, 2)
    return EdgeIndex(src, dst, order_arr[:, 0], order_arr[:, 1])


def _order_edges(n: int, id_arr: np.ndarray, src: np.ndarray, dst: np.ndarray, write_arr: np.ndarray,
                 alias_arr: np.ndarray) -> list[tuple[int, int]]:
    """The ORDER edges (rule 3) given the data edges (``dst`` ascending), in the order they are found."""
    alias = alias_arr[dst]
    label = _alias_classes(n, src[alias], dst[alias])
    # A class is named by its smallest node id (rule 2's union-find named it so).
    smallest = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(smallest, label, id_arr)
    name = smallest[label]
    written_names = sorted_unique(name[dst[write_arr[dst]]])
    written = set(written_names.tolist())
    source_class = name[src]
    touched = sorted_isin(source_class, written_names)
    ptr = np.concatenate(([0], np.cumsum(np.bincount(dst, minlength=n)))).tolist()
    classes = source_class.tolist()
    readers: dict[int, list[int]] = {}
    for i in sorted_unique(dst[touched]).tolist():  # execution order, so each list is sorted
        if ptr[i + 1] - ptr[i] == 1:  # one input (most nodes): its class is written, as i is touched
            chain = readers.get(classes[ptr[i]])
            if chain is None:
                readers[classes[ptr[i]]] = [i]
            else:
                chain.append(i)
            continue
        for cls in {classes[k] for k in range(ptr[i], ptr[i + 1])}:
            if cls not in written:
                continue
            chain = readers.get(cls)
            if chain is None:
                readers[cls] = [i]
            else:
                chain.append(i)
    writes_list = write_arr.tolist()
    found: dict[tuple[int, int], None] = {}
    for chain in readers.values():
        since_write: list[int] = []
        last_writer = -1
        for i in chain:
            if last_writer >= 0:
                found[(last_writer, i)] = None
            if writes_list[i]:
                for reader in since_write:
                    found[(reader, i)] = None
                since_write = []
                last_writer = i
            else:
                since_write.append(i)
    sources = src.tolist()  # a data edge (a, b) is a in sources[ptr[b]:ptr[b + 1]]: b's few inputs
    return [e for e in found if e[0] != e[1] and e[0] not in sources[ptr[e[1]]:ptr[e[1] + 1]]]


def graph_edge_index(graph: GraphRecord) -> EdgeIndex:
    """``edge_index_arrays`` of a graph record's nodes."""
    types = graph_column(graph, "type")  # columns: a loaded graph builds no record
    writes = inplace_writes(graph_column(graph, "is_inplace"), types)
    aliases = [w or view or t == "getitem" for w, view, t in zip(writes, graph_column(graph, "is_view"), types)]
    ids = graph_column(graph, "id")
    flat, offsets = graph_input_arrays(graph)  # not the inputs column: no tuple per node
    return edge_index_arrays(np.fromiter(ids, dtype=np.int64, count=len(ids)), flat, np.diff(offsets), writes, aliases)


def edge_arrays(graph: GraphRecord) -> EdgeArrays:
    """DATA and ORDER edges of ``graph`` (rules 1 to 3 above) in positions; see ``data_edges``, ``order_edges``."""
    return graph_edge_index(graph).lists()


def data_edges(graph: GraphRecord) -> tuple[DataflowEdge, ...]:
    """Producer → consumer edges from ``NodeRecord.inputs`` (forward in execution order only)."""
    nodes = graph.nodes
    return tuple(DataflowEdge(nodes[s].id, nodes[d].id, EdgeKind.DATA) for s, d in edge_arrays(graph).data)


def order_edges(graph: GraphRecord) -> tuple[DataflowEdge, ...]:
    """ORDER edges that in-place writes require (rules 2 and 3 above), data edges excluded."""
    nodes = graph.nodes
    return tuple(DataflowEdge(nodes[s].id, nodes[d].id, EdgeKind.ORDER) for s, d in edge_arrays(graph).order)


def _node_attributes(graph: GraphRecord, position: int, node: NodeRecord, stat: str) -> dict[str, Any]:
    memory = node.memory
    return {
        "graph_id": graph.id, "position": position, "node_id": node.id, "name": node.name,
        "op": node.op, "type": node.type, "inputs": node.inputs,
        "in_shapes": node.in_shapes, "in_dtypes": node.in_dtypes,
        "out_shapes": node.out_shapes, "out_dtypes": node.out_dtypes,
        "module": node.module, "module_type": node.module_type, "source": node.source,
        "phase": node.phase.value, "scope": node.scope, "is_view": node.is_view,
        "inplace": is_inplace_write(node),
        "flops": node.flops, "bytes_read": node.bytes_read, "bytes_written": node.bytes_written,
        "memory": None if memory is None else {
            "allocated_bytes": memory.allocated_bytes, "freed_bytes": memory.freed_bytes,
            "live_bytes": memory.live_bytes, "live_by_category_bytes": dict(memory.live_by_category_bytes),
        },
        "host_time_s": node.host_time_s, "device_time_s": node.device_time_s,
        "time_s": node_time_s(node, stat),
    }


def dataflow_graph(graph: GraphRecord, stat: str = "median", attributes: bool = True) -> nx.DiGraph:
    """The DAG of one graph: node attributes from its records, edges with a ``kind``.

    Node keys are ``NodeRecord.id`` (also the ``node_id`` attribute: an
    attribute called ``id`` would clash with node-link JSON's key field);
    ``time_s`` is the node's time under ``stat``. Graph attributes: ``graph_id``, ``name``, ``kind``, ``stat``.
    With ``attributes=False`` nodes carry only ``position`` and ``time_s``.
    """
    import networkx as nx

    stat_fn(stat)  # a bad statistic fails here, with the list of valid ones
    dag = nx.DiGraph(graph_id=graph.id, name=graph.name, kind=graph.kind.value, stat=stat)
    if attributes:
        dag.add_nodes_from((node.id, _node_attributes(graph, i, node, stat)) for i, node in enumerate(graph.nodes))
    else:  # what path algorithms need, several times faster on 100,000-node graphs
        dag.add_nodes_from((node.id, {"position": i, "time_s": node_time_s(node, stat)})
                           for i, node in enumerate(graph.nodes))
    edges = edge_arrays(graph)
    nodes = graph.nodes
    dag.add_edges_from((nodes[s].id, nodes[d].id, {"kind": EdgeKind.DATA}) for s, d in edges.data)
    dag.add_edges_from((nodes[s].id, nodes[d].id, {"kind": EdgeKind.ORDER}) for s, d in edges.order)
    return dag


def edges_of(dag: nx.DiGraph, kind: EdgeKind | None = None) -> Sequence[DataflowEdge]:
    """The edges of a dataflow graph as records, optionally only one kind."""
    return [DataflowEdge(s, d, k) for s, d, k in dag.edges(data="kind") if kind is None or k == kind]
