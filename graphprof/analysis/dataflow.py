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
from typing import Any, Sequence

import networkx as nx

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, NodeRecord


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
    """True for ops that write one of their inputs (rule 1 above)."""
    op_type = node.type
    return op_type.endswith("_") and not op_type.endswith("__")


def _aliases_inputs(node: NodeRecord) -> bool:
    return node.is_view or node.type == "getitem" or is_inplace_write(node)


def node_samples_s(node: NodeRecord) -> tuple[float, ...]:
    """The samples a node's time comes from: device time where recorded, else host time.

    On an accelerator host time is only dispatch time; on CPU there is no
    device time and host time is the op's time.
    """
    return node.device_time_s if node.device_time_s else node.host_time_s


def node_time_s(node: NodeRecord, stat: str = "median") -> float:
    """A node's time under ``stat`` (``median``, ``mean``, ``min``, ``max``)."""
    return stat_fn(stat)(node_samples_s(node))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        root = self.parent.setdefault(x, x)
        while root != self.parent[root]:
            root = self.parent[root]
        while x != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _positions(graph: GraphRecord) -> dict[int, int]:
    return {node.id: i for i, node in enumerate(graph.nodes)}


def data_edges(graph: GraphRecord) -> tuple[DataflowEdge, ...]:
    """Producer → consumer edges from ``NodeRecord.inputs`` (forward in execution order only)."""
    pos = _positions(graph)
    edges: list[DataflowEdge] = []
    for i, node in enumerate(graph.nodes):
        for src in dict.fromkeys(node.inputs):
            if src in pos and pos[src] < i:
                edges.append(DataflowEdge(src, node.id, EdgeKind.DATA))
    return tuple(edges)


def order_edges(graph: GraphRecord) -> tuple[DataflowEdge, ...]:
    """ORDER edges that in-place writes require (rules 2 and 3 above), data edges excluded."""
    pos = _positions(graph)
    uf = _UnionFind()
    for node in graph.nodes:
        if _aliases_inputs(node):
            for src in node.inputs:
                if src in pos and pos[src] < pos[node.id]:
                    uf.union(node.id, src)
    readers: dict[int, list[NodeRecord]] = {}
    for node in graph.nodes:  # execution order, so each list is sorted
        classes = {uf.find(src) for src in node.inputs if src in pos and pos[src] < pos[node.id]}
        for cls in classes:
            readers.setdefault(cls, []).append(node)
    data = {(e.src, e.dst) for e in data_edges(graph)}
    found: dict[tuple[int, int], None] = {}
    for chain in readers.values():
        since_write: list[int] = []
        last_writer: int | None = None
        for node in chain:
            if last_writer is not None:
                found[(last_writer, node.id)] = None
            if is_inplace_write(node):
                for reader in since_write:
                    found[(reader, node.id)] = None
                since_write = []
                last_writer = node.id
            else:
                since_write.append(node.id)
    return tuple(DataflowEdge(s, d, EdgeKind.ORDER) for (s, d) in found if s != d and (s, d) not in data)


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
    dag = nx.DiGraph(graph_id=graph.id, name=graph.name, kind=graph.kind.value, stat=stat)
    if attributes:
        dag.add_nodes_from((node.id, _node_attributes(graph, i, node, stat)) for i, node in enumerate(graph.nodes))
    else:  # what path algorithms need, several times faster on 100,000-node graphs
        dag.add_nodes_from((node.id, {"position": i, "time_s": node_time_s(node, stat)})
                           for i, node in enumerate(graph.nodes))
    dag.add_edges_from((e.src, e.dst, {"kind": e.kind}) for e in data_edges(graph) + order_edges(graph))
    return dag


def edges_of(dag: nx.DiGraph, kind: EdgeKind | None = None) -> Sequence[DataflowEdge]:
    """The edges of a dataflow graph as records, optionally only one kind."""
    return [DataflowEdge(s, d, k) for s, d, k in dag.edges(data="kind") if kind is None or k == kind]
