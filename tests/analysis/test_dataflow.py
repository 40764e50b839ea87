"""The dataflow graph: data edges from inputs, ordering edges for in-place writes, node attributes."""

from __future__ import annotations

import networkx as nx
import pytest

from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.dataflow import (
    DataflowEdge,
    EdgeKind,
    dataflow_graph,
    data_edges,
    edges_of,
    is_inplace_write,
    node_time_s,
    order_edges,
)
from graphprof.profile.model import NodeRecord, Phase
from tests.analysis.conftest import graph, node


def _pairs(edges: object, kind: EdgeKind | None = None) -> set[tuple[int, int]]:
    return {(e.src, e.dst) for e in edges if kind is None or e.kind == kind}  # type: ignore[attr-defined]


def test_data_edges_follow_inputs_and_nodes_carry_their_record() -> None:
    g = graph(node(0, "mm", module="fc", flops=64, phase=Phase.FORWARD),
              node(1, "relu", (0,)), node(2, "add", (0, 1, 0)), graph_id=3)
    dag = dataflow_graph(g)
    assert _pairs(edges_of(dag)) == {(0, 1), (0, 2), (1, 2)}
    assert all(k == EdgeKind.DATA for _, _, k in dag.edges(data="kind"))
    attrs = dag.nodes[0]
    assert (attrs["type"], attrs["module"], attrs["flops"], attrs["phase"], attrs["graph_id"]) == ("mm", "fc", 64, "forward", 3)
    assert attrs["time_s"] == 1.0 and attrs["position"] == 0
    assert dag.graph["graph_id"] == 3 and dag.graph["stat"] == "median"


def test_inplace_rule_names_trailing_underscore_ops_but_not_dunders() -> None:
    for op_type in ("add_", "mul_", "addcdiv_", "_foreach_add_", "copy_", "zero_"):
        assert is_inplace_write(node(0, op_type))
    for op_type in ("add", "_log_softmax", "__and__", "getitem", "native_batch_norm"):
        assert not is_inplace_write(node(0, op_type))


def test_writer_is_ordered_after_earlier_readers_and_before_later_readers() -> None:
    # x (0) is read by relu (1), then written in place by mul_ (2), then read by neg (3):
    # relu must run before the write although no data flows from it to mul_.
    g = graph(node(0, "mm"), node(1, "relu", (0,)), node(2, "mul_", (0,)), node(3, "neg", (0,)))
    order = order_edges(g)
    assert _pairs(order) == {(1, 2), (2, 3)}
    assert all(e.kind == EdgeKind.ORDER for e in order)
    assert DataflowEdge(1, 2, EdgeKind.ORDER) in order


def test_readers_through_a_view_are_ordered_too() -> None:
    # v = x.t() (1) aliases x; reading v (2) before x is written (3) must stay before the write.
    g = graph(node(0, "mm"), node(1, "t", (0,), is_view=True), node(2, "sum", (1,)), node(3, "add_", (0,)),
              node(4, "exp", (1,)))
    dag = dataflow_graph(g)
    order = _pairs(edges_of(dag, EdgeKind.ORDER))
    assert (2, 3) in order and (3, 4) in order
    assert nx.has_path(dag, 2, 3) and nx.has_path(dag, 3, 4)


def test_chains_of_writes_order_every_reader_with_few_edges() -> None:
    # Ten readers, a write, ten readers, a write, ... of one tensor.
    nodes = [node(0, "mm")]
    for block in range(5):
        base = 1 + block * 11
        nodes += [node(base + r, "relu", (0,)) for r in range(10)]
        nodes.append(node(base + 10, "add_", (0,)))
    g = graph(*nodes)
    dag = dataflow_graph(g)
    writers = [n.id for n in nodes if n.type == "add_"]
    readers = [n.id for n in nodes if n.type == "relu"]
    for w in writers:
        for r in readers:
            assert nx.has_path(dag, r, w) if r < w else nx.has_path(dag, w, r)
    assert len(order_edges(g)) <= 2 * len(readers) + len(writers)  # O(readers), not readers x writers
    assert nx.is_directed_acyclic_graph(dag)


def test_data_edges_already_present_are_not_repeated_as_order_edges() -> None:
    g = graph(node(0, "mm"), node(1, "relu", (0,)), node(2, "add_", (0, 1)))
    assert (1, 2) in _pairs(data_edges(g)) and (1, 2) not in _pairs(order_edges(g))


def test_backward_or_unknown_inputs_are_dropped_so_the_graph_stays_acyclic() -> None:
    g = graph(node(0, "mm", (1,)), node(1, "relu", (0, 99)))
    dag = dataflow_graph(g)
    assert _pairs(edges_of(dag)) == {(0, 1)}
    assert nx.is_directed_acyclic_graph(dag)


def test_time_follows_the_statistic_and_prefers_device_time() -> None:
    n = NodeRecord(id=0, name="a", op="aten.mm.default", type="mm", host_time_ns=seconds_to_ns((1.0, 2.0, 9.0)))
    assert node_time_s(n, "median") == 2.0 and node_time_s(n, "max") == 9.0 and node_time_s(n, "min") == 1.0
    on_device = NodeRecord(id=0, name="a", op="aten.mm.default", type="mm", host_time_ns=seconds_to_ns((1.0,)), device_time_ns=seconds_to_ns((5.0,)))
    assert node_time_s(on_device) == 5.0
    with pytest.raises(ValueError, match="unknown statistic"):
        dataflow_graph(graph(n), stat="p99")


def test_empty_graph_gives_an_empty_dag() -> None:
    dag = dataflow_graph(graph())
    assert dag.number_of_nodes() == 0 and dag.number_of_edges() == 0
