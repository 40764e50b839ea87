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

from graphprof.analysis.node_time import node_time_s
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, NodeRecord

if TYPE_CHECKING:  # networkx is imported where a graph is built: exports and views that
    import networkx as nx  # need only edge arrays do not pay its import


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


def _aliases_inputs(node: NodeRecord) -> bool:
    return node.is_view or node.type == "getitem" or is_inplace_write(node)


def _find(parent: list[int], x: int) -> int:
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:  # path compression
        parent[x], x = root, parent[x]
    return root


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


def edge_arrays(graph: GraphRecord) -> EdgeArrays:
    """DATA and ORDER edges of ``graph`` (rules 1 to 3 above) in positions; see ``data_edges``, ``order_edges``."""
    nodes = graph.nodes
    pos = {node.id: i for i, node in enumerate(nodes)}
    get = pos.get
    # Each node's distinct producers that run before it, in input order.
    sources: list[list[int]] = []
    data: list[tuple[int, int]] = []
    for i, node in enumerate(nodes):
        srcs = []
        inputs = node.inputs
        for src in (inputs if len(inputs) < 2 else dict.fromkeys(inputs)):
            p = get(src)
            if p is not None and p < i:
                srcs.append(p)
                data.append((p, i))
        sources.append(srcs)
    writes = [is_inplace_write(node) for node in nodes]
    ids = [node.id for node in nodes]
    parent = list(range(len(nodes)))
    for i, node in enumerate(nodes):
        if sources[i] and (writes[i] or node.is_view or node.type == "getitem"):
            for p in sources[i]:
                ra, rb = _find(parent, i), _find(parent, p)
                if ra != rb:  # the root is the member with the smallest id, so classes are named by it
                    if ids[ra] > ids[rb]:
                        parent[ra] = rb
                    else:
                        parent[rb] = ra
    # Only a class with a writer gets ORDER edges (a writer belongs to the class of what it writes):
    # readers of the other classes need not be listed.
    written = {ids[_find(parent, i)] for i, srcs in enumerate(sources) if srcs and writes[i]}
    readers: dict[int, list[int]] = {}
    for i, srcs in enumerate(sources) if written else ():  # execution order, so each list is sorted
        if srcs:
            for cls in {ids[_find(parent, p)] for p in srcs}:
                if cls not in written:
                    continue
                chain = readers.get(cls)
                if chain is None:
                    readers[cls] = [i]
                else:
                    chain.append(i)
    data_set = set(data)
    found: dict[tuple[int, int], None] = {}
    for chain in readers.values():
        since_write: list[int] = []
        last_writer = -1
        for i in chain:
            if last_writer >= 0:
                found[(last_writer, i)] = None
            if writes[i]:
                for reader in since_write:
                    found[(reader, i)] = None
                since_write = []
                last_writer = i
            else:
                since_write.append(i)
    order = [e for e in found if e[0] != e[1] and e not in data_set]
    return EdgeArrays(data, order)


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
    stat_fn(stat)  # a bad statistic fails here, with the list of valid ones
    import networkx as nx

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
