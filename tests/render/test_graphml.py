"""GraphML and node-link JSON round-trip through networkx with every attribute intact."""

from __future__ import annotations

import io
import json
from pathlib import Path

import networkx as nx
import pytest

from graphprof.api import Profile
from graphprof.render.graphml import graphml_attributes, graphml_text, node_link_json, node_key, profile_graph
from tests.render.export_profiles import HOSTILE, empty_profile, hostile_profile, synthetic_profile


def _json_native(value: object) -> object:
    return json.loads(json.dumps(value))


def _check_graphml_round_trip(profile: Profile) -> nx.DiGraph:
    expected = profile_graph(profile)
    back = nx.read_graphml(io.BytesIO(graphml_text(profile).encode("utf-8")))
    assert set(back.nodes) == set(expected.nodes)
    assert set(back.edges) == set(expected.edges)
    for n, attrs in expected.nodes(data=True):
        assert back.nodes[n] == graphml_attributes(attrs), n
    for a, b, kind in expected.edges(data="kind"):
        assert back.edges[a, b]["kind"] == kind
    return back


def _check_node_link_round_trip(profile: Profile) -> nx.DiGraph:
    expected = profile_graph(profile)
    back = nx.node_link_graph(json.loads(node_link_json(profile)), edges="edges")
    assert set(back.nodes) == set(expected.nodes) and set(back.edges) == set(expected.edges)
    for n, attrs in expected.nodes(data=True):
        assert back.nodes[n] == _json_native(attrs), n
    return back


def test_synthetic_graphml_keeps_every_field_of_every_node() -> None:
    p = synthetic_profile()
    back = _check_graphml_round_trip(p)
    mm = back.nodes[node_key(0, 0)]
    assert mm["type"] == "mm" and mm["flops"] == 8192 and mm["module"] == "fc1" and mm["phase"] == "forward"
    assert json.loads(mm["in_shapes"]) == [[8, 16], [16, 32]]
    assert mm["memory_live_bytes"] == 5000 and json.loads(mm["memory_live_by_category_bytes"])["activations"] == 1000
    assert mm["is_view"] is False and mm["critical_path"] is True
    assert json.loads(mm["host_time_s"]) == [2e-3, 3e-3, 2.5e-3]
    assert back.nodes[node_key(0, 2)]["is_view"] is True
    order = [(a, b) for a, b, k in back.edges(data="kind") if k == "order"]
    data = [(a, b) for a, b, k in back.edges(data="kind") if k == "data"]
    assert data and all(k in ("data", "order") for _, _, k in back.edges(data="kind"))
    assert order == [] or all(a != b for a, b in order)


def test_real_profile_round_trips_in_both_formats(real: Profile) -> None:
    back = _check_graphml_round_trip(real)
    assert back.number_of_nodes() == real.node_count
    linked = _check_node_link_round_trip(real)
    assert linked.graph["function"] == real.meta.function and linked.graph["steps"] == len(real.steps)


def test_node_link_keeps_native_values() -> None:
    back = _check_node_link_round_trip(synthetic_profile())
    mm = back.nodes[node_key(0, 0)]
    assert mm["in_shapes"] == [[8, 16], [16, 32]] and mm["memory"]["live_bytes"] == 5000
    assert back.nodes[node_key(0, 2)]["flops"] is None


def test_hostile_names_round_trip() -> None:
    back = _check_graphml_round_trip(hostile_profile())
    first = back.nodes[node_key(0, 0)]
    assert first["module"] == HOSTILE.replace("\x01", " ")  # XML 1.0 cannot hold control characters
    assert first["type"] == HOSTILE.replace("\x01", " ")
    linked = _check_node_link_round_trip(hostile_profile())
    assert linked.nodes[node_key(0, 0)]["module"] == HOSTILE


def test_empty_profile_gives_empty_graphs() -> None:
    assert _check_graphml_round_trip(empty_profile()).number_of_nodes() == 0
    assert _check_node_link_round_trip(empty_profile()).number_of_nodes() == 0


@pytest.mark.parametrize("make", [synthetic_profile, hostile_profile])
def test_a_loaded_profile_reads_back_as_the_profile(make: object, tmp_path: Path) -> None:
    """A loaded profile is written from its columns (samples array, whole-column escaping checks):
    networkx reads back every node, attribute and edge the profile holds, hostile names included."""
    built = make()  # type: ignore[operator]
    built.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    expected = profile_graph(built)
    back = nx.read_graphml(io.BytesIO(graphml_text(loaded).encode("utf-8")))
    assert list(back.nodes) == list(expected.nodes) and list(back.edges) == list(expected.edges)
    for n, attrs in expected.nodes(data=True):
        assert back.nodes[n] == graphml_attributes(attrs), n
    linked = nx.node_link_graph(json.loads(node_link_json(loaded)), edges="edges")
    assert list(linked.edges(data="kind")) == list(expected.edges(data="kind"))
    for n, attrs in expected.nodes(data=True):
        assert linked.nodes[n] == _json_native(attrs), n
