"""Cost coverage: share of nodes and of time with a FLOP count, ops without one; torch-free."""

from __future__ import annotations

import json
import subprocess
import sys

from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.coverage import cost_coverage, node_coverage
from graphprof.profile.model import NodeRecord
from tests.analysis.conftest import node, one_graph_profile


def test_shares_of_nodes_and_of_median_time() -> None:
    profile = one_graph_profile([
        node(0, "mm", times=(3.0, 1.0, 2.0), flops=100),      # median 2
        node(1, "view", times=(0.5, 0.5, 0.5), flops=0),      # free, and covered
        node(2, "fancy", times=(1.0, 1.0, 9.0), op="mylib.fancy.default", flops=None),  # median 1
        node(3, "other", times=(0.25, 0.25, 0.25), op="mylib.other.default", flops=None),
        node(4, "fancy", times=(0.25, 0.25, 0.25), op="mylib.fancy.default", flops=None),
    ])
    cov = cost_coverage(profile)
    assert (cov.nodes, cov.covered_nodes) == (5, 2)
    assert cov.node_share == 2 / 5
    assert cov.time_s == 2.0 + 0.5 + 1.0 + 0.25 + 0.25
    assert cov.time_share == 2.5 / 4.0
    assert cov.uncovered_ops == ("mylib.fancy.default", "mylib.other.default")  # slowest first
    assert [(u.nodes, u.time_s) for u in cov.uncovered] == [(2, 1.25), (1, 0.25)]
    assert cost_coverage(profile, stat="max").time_share == (3.0 + 0.5) / (3.0 + 0.5 + 9.0 + 0.25 + 0.25)


def test_to_dict_is_plain_json_and_an_empty_profile_misses_nothing() -> None:
    cov = cost_coverage(one_graph_profile([node(0, "relu", times=(1e-06,), flops=None)]))
    doc = json.loads(json.dumps(cov.to_dict()))
    assert doc["node_share"] == 0.0 and doc["time_share"] == 0.0
    assert doc["ops_without_formula"] == [{"op": "aten.relu.default", "nodes": 1, "time_s": 1e-6}]
    empty = node_coverage([])
    assert (empty.node_share, empty.time_share, empty.uncovered) == (1.0, 1.0, ())
    untimed = node_coverage([node(0, "mm", times=(), flops=1), node(1, "x", times=(), flops=None)])
    assert untimed.time_share == untimed.node_share == 0.5  # no samples: the node share stands in


def test_host_time_records_of_segmented_capture_are_not_ops() -> None:
    nodes = [node(0, "mm", times=(1.0,), flops=10),
             NodeRecord(id=1, name="host gap: a -> b", op="host.gap", type="host_gap", host_time_ns=seconds_to_ns((5.0,))),
             NodeRecord(id=2, name="Tensor.item() at x.py:3", op="Tensor.item", type="item", host_time_ns=seconds_to_ns((2.0,)))]
    cov = node_coverage(nodes)
    assert (cov.nodes, cov.time_s, cov.node_share, cov.time_share, cov.uncovered) == (1, 1.0, 1.0, 1.0, ())


def test_coverage_module_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import graphprof, graphprof.analysis.coverage\n"
        "assert callable(graphprof.register_cost)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_traced_profile_carries_costs_and_its_coverage_survives_a_round_trip(tmp_path) -> None:
    import graphprof
    from graphprof.demo.steps import mlp_sgd_step

    demo = mlp_sgd_step()
    fn = graphprof.trace(demo.step_fn)
    for i in range(3):  # eager, capture, one profiled step
        fn(*demo.make_inputs(i))
    profile = fn.get_profile()
    coverage = cost_coverage(profile).to_dict()
    assert coverage["node_share"] == 1.0 and coverage["ops_without_formula"] == []
    assert all(n.flops is not None and n.bytes_read is not None for _, n in profile.iter_nodes())
    assert sum(n.flops for _, n in profile.iter_nodes()) > 0
    path = tmp_path / "step.json"
    profile.save(str(path))
    # Coverage is derived from the saved costs, not stored beside them.
    assert cost_coverage(graphprof.load(str(path))).to_dict() == coverage
