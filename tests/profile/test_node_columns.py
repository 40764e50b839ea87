"""A loaded graph keeps its file's columns and builds NodeRecords only when ``graph.nodes`` is read."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from graphprof.profile import GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase, Profile, StepRecord
from graphprof.profile.model import ProfileError, graph_size, node_source, profile_from_document
from graphprof.profile.node_columns import NodeColumns


def _profile() -> Profile:
    """Two graphs: explicit ids, edges, memory records on some nodes, device samples on one graph."""
    step = (
        NodeRecord(id=5, name="mm", op="aten.mm.default", type="mm", phase=Phase.FORWARD, flops=10,
                   memory=MemoryRecord(allocated_bytes=8, live_bytes=8, live_by_category_bytes={"activations": 8}),
                   host_time_ns=(3, 1, 2, 4), device_time_ns=(30, 10, 20, 40)),
        NodeRecord(id=7, name="relu", op="aten.relu.default", type="relu", inputs=(5,), is_view=True,
                   is_inplace=False, host_time_ns=(5, 5, 6, 7), device_time_ns=(1, 2, 3, 4)),
        NodeRecord(id=9, name="add", op="aten.add.Tensor", type="add", inputs=(7, 5), bytes_read=4,
                   memory=MemoryRecord(freed_bytes=8), host_time_ns=(1, 2, 3, 5), device_time_ns=(9, 9, 9, 9)),
    )
    host = (NodeRecord(id=0, name="grad", op="host.assign_grad", type="assign_grad", host_time_ns=(2, 4, 6, 8)),)
    return Profile(steps=tuple(StepRecord(i, 1.0) for i in range(4)),
                   graphs=(GraphRecord(2, "step", GraphKind.STEP, step), GraphRecord(3, "host", GraphKind.HOST, host)))


def _loaded(profile: Profile) -> Profile:
    return profile_from_document(json.loads(json.dumps(profile.to_dict())))


def test_a_loaded_graph_builds_no_record_until_nodes_is_read() -> None:
    loaded = _loaded(_profile())
    graph = loaded.graphs[0]
    assert isinstance(node_source(graph), NodeColumns)
    assert graph.__dict__["nodes"] is None and graph_size(graph) == 3 and loaded.node_count == 4
    assert graph.nodes == _profile().graphs[0].nodes  # built on this read, equal to the saved records
    assert graph.__dict__["nodes"] is graph.nodes  # and kept
    assert loaded == _profile()


def test_one_record_equals_the_built_ones() -> None:
    loaded = _loaded(_profile())
    for graph in loaded.graphs:
        source = node_source(graph)
        assert isinstance(source, NodeColumns)
        singles = tuple(source.record(i) for i in range(source.size))
        assert singles == graph.nodes


def test_columns_equal_the_record_fields() -> None:
    loaded, built = _loaded(_profile()), _profile()
    source = node_source(loaded.graphs[0])
    assert isinstance(source, NodeColumns)
    for name in ("id", "inputs", "phase", "is_view", "is_inplace", "flops", "memory", "host_time_ns", "attrs"):
        assert source.column(name) == [getattr(n, name) for n in built.graphs[0].nodes], name
    assert source.phase_values() == ["forward", "other", "other"]
    assert source.memory_field("freed_bytes") == [0, None, 8]
    samples = source.samples_ns("device_time_ns")
    assert samples is not None and samples.shape == (4, 3) and samples[:, 0].tolist() == [30, 10, 20, 40]


def test_records_stay_frozen_and_graphs_copy_and_pickle() -> None:
    graph = _loaded(_profile()).graphs[0]
    with pytest.raises(AttributeError):
        graph.nodes = ()  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(graph)) == graph
    assert copy.deepcopy(graph) == graph
    assert GraphRecord(0, "g", GraphKind.STEP).nodes == ()


def test_an_input_edge_outside_the_graph_is_one_sentence() -> None:
    doc = json.loads(json.dumps(_profile().to_dict()))
    doc["graphs"][0]["columns"]["inputs"][1] = [2**70]  # no int64 holds it
    with pytest.raises(ProfileError, match="refers to a node the graph does not have"):
        profile_from_document(doc)
    doc["graphs"][0]["columns"]["inputs"][1] = [1]  # id 7 - 1 = 6: no such node
    with pytest.raises(ProfileError, match="refers to a node the graph does not have"):
        profile_from_document(doc)
    doc["graphs"][0]["columns"]["memory"]["live_by_category_bytes"]["values"][0] = [1, 2]
    doc["graphs"][0]["columns"]["inputs"][1] = [2]
    with pytest.raises(ProfileError, match="live_by_category_bytes.values holds a malformed entry"):
        profile_from_document(doc)
