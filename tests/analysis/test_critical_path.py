"""Critical path on graphs whose longest path is known: parallel branches of known cost."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest

from graphprof.analysis.critical_path import critical_path, critical_paths, longest_path
from graphprof.analysis.dataflow import EdgeKind, dataflow_graph
from graphprof.profile.model import Profile
from tests.analysis.conftest import graph, node


def test_diamond_takes_the_slower_branch() -> None:
    # a(1) -> b(5) -> d(1) and a -> c(2) -> d: longest a, b, d = 7 of 9 serial.
    g = graph(node(0, "op", (), (1.0,)), node(1, "op", (0,), (5.0,)), node(2, "op", (0,), (2.0,)),
              node(3, "op", (1, 2), (1.0,)))
    cp = critical_path(g)
    assert cp.nodes == (0, 1, 3)
    assert cp.length_s == pytest.approx(7.0) and cp.serial_s == pytest.approx(9.0)
    assert cp.ratio == pytest.approx(7.0 / 9.0)
    assert cp.edge_kinds == (EdgeKind.DATA, EdgeKind.DATA)


def test_independent_chains_of_known_cost() -> None:
    # Three chains interleaved in execution order, costing 6, 9 and 4: the 9 chain is critical.
    costs = {"a": [1.0, 2.0, 3.0], "b": [4.0, 4.0, 1.0], "c": [2.0, 2.0]}
    nodes, ids, prev = [], {}, {}
    for step in range(3):
        for chain, times in costs.items():
            if step < len(times):
                i = len(nodes)
                nodes.append(node(i, "op", (prev[chain],) if chain in prev else (), (times[step],)))
                ids.setdefault(chain, []).append(i)
                prev[chain] = i
    cp = critical_path(graph(*nodes))
    assert cp.nodes == tuple(ids["b"]) and cp.length_s == pytest.approx(9.0)
    assert cp.serial_s == pytest.approx(19.0)


def test_an_inplace_write_after_a_slow_reader_lengthens_the_path() -> None:
    # x(1); slow reader relu(10) of x; x.mul_(1) must wait for relu; exp(1) reads the written x.
    # Without the ordering edge the longest path would be x, relu = 11; with it x, relu, mul_, exp = 13.
    g = graph(node(0, "op", (), (1.0,)), node(1, "relu", (0,), (10.0,)), node(2, "mul_", (0,), (1.0,)),
              node(3, "exp", (2,), (1.0,)))
    cp = critical_path(g)
    assert cp.nodes == (0, 1, 2, 3) and cp.length_s == pytest.approx(13.0)
    assert cp.edge_kinds == (EdgeKind.DATA, EdgeKind.ORDER, EdgeKind.DATA)


def test_the_statistic_decides_the_weights() -> None:
    # Branch 1 is usually fast with one slow outlier; branch 2 is steady.
    g = graph(node(0, "op", (), (1.0, 1.0, 1.0)), node(1, "op", (0,), (1.0, 1.0, 30.0)),
              node(2, "op", (0,), (5.0, 5.0, 5.0)))
    assert critical_path(g, stat="median").nodes == (0, 2)
    assert critical_path(g, stat="mean").nodes == (0, 1)
    assert critical_path(g, stat="max").length_s == pytest.approx(31.0)


def test_a_chain_has_ratio_one_and_an_empty_graph_zero() -> None:
    chain = graph(*[node(i, "op", (i - 1,) if i else (), (0.5,)) for i in range(6)])
    cp = critical_path(chain)
    assert cp.nodes == tuple(range(6)) and cp.ratio == pytest.approx(1.0)
    empty = critical_path(graph())
    assert (empty.nodes, empty.length_s, empty.serial_s, empty.ratio) == ((), 0.0, 0.0, 0.0)


def _all_paths_longest(dag: nx.DiGraph) -> float:
    """Brute force: the heaviest of every source-to-sink path."""
    sources = [n for n in dag if dag.in_degree(n) == 0]
    sinks = [n for n in dag if dag.out_degree(n) == 0]
    best = 0.0
    for s, t in itertools.product(sources, sinks):
        paths = [[s]] if s == t else nx.all_simple_paths(dag, s, t)
        for path in paths:
            best = max(best, sum(dag.nodes[n]["time_s"] for n in path))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    nodes = []
    for i in range(14):
        inputs = tuple(sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3)))))
        op_type = "add_" if rng.random() < 0.15 else "op"
        nodes.append(node(i, op_type, inputs, (rng.choice([0.5, 1.0, 2.0, 3.5, 7.0]),)))
    dag = dataflow_graph(graph(*nodes))
    path, length = longest_path(dag)
    assert length == pytest.approx(_all_paths_longest(dag))
    assert all(dag.has_edge(a, b) for a, b in zip(path, path[1:]))
    assert sum(dag.nodes[n]["time_s"] for n in path) == pytest.approx(length)


def test_one_path_per_graph_of_a_profile() -> None:
    g0 = graph(node(0, "op", (), (1.0,)), node(1, "op", (), (2.0,)), graph_id=0)
    g1 = graph(node(0, "op", (), (3.0,)), node(1, "op", (0,), (4.0,)), graph_id=1)
    paths = critical_paths(Profile(graphs=(g0, g1)))
    assert [p.graph_id for p in paths] == [0, 1]
    assert [p.length_s for p in paths] == [pytest.approx(2.0), pytest.approx(7.0)]


@pytest.mark.parametrize("seed", range(6))
def test_the_array_path_of_a_loaded_profile_is_the_record_path(seed: int, tmp_path) -> None:
    # Mostly chains (runs summed in one go by the array path), some joins, in-place writers (ORDER
    # edges) and many equal times (ties): the profile's paths, loaded from a file, equal the records'.
    rng = random.Random(seed)
    nodes = []
    for i in range(300):
        if i and rng.random() < 0.7:
            inputs: tuple[int, ...] = (i - 1,)
        else:
            inputs = tuple(sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3)))))
        op_type = "add_" if rng.random() < 0.1 else "getitem" if rng.random() < 0.05 else "op"
        nodes.append(node(i, op_type, inputs, (rng.choice([0.0, 1.0, 1.0, 2.0, 3.5]),)))
    g = graph(*nodes)
    path = tmp_path / "p.json"
    Profile(graphs=(g,)).save(str(path))
    (loaded,) = critical_paths(Profile.load(str(path)))
    expected = critical_path(g)
    assert (loaded.nodes, loaded.edge_kinds, loaded.length_s, loaded.serial_s) == (
        expected.nodes, expected.edge_kinds, expected.length_s, expected.serial_s)
