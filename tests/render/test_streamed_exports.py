"""Streamed exports: the same documents as the writers they replaced, and files that stay whole."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import networkx as nx
import pytest

from graphprof.analysis.frame import node_frame
from graphprof.api import Profile
from graphprof.profile.model import DeviceMemorySample
from graphprof.render import exporters, streamed
from graphprof.render.chrome_trace import chrome_trace_json
from graphprof.render.exporters import ExportError, export_profile
from graphprof.render.graph_stream import model_typed
from graphprof.render.graphml import graphml_text, graphml_via_networkx, node_link_json, profile_graph
from graphprof.render.units import format_bytes
from tests.render.export_profiles import empty_profile, hostile_profile, synthetic_profile
from tests.render.reference_trace import reference_trace_json

BOUNDS = {(0, 3): "compute", 1: "memory"}


def _profiles(real: Profile) -> dict[str, Profile]:
    return {"real": real, "synthetic": synthetic_profile(), "hostile": hostile_profile(), "empty": empty_profile()}


def test_trace_is_byte_identical_to_the_dict_built_trace(real: Profile) -> None:
    for name, profile in _profiles(real).items():
        for bounds in (None, BOUNDS):
            assert chrome_trace_json(profile, bounds=bounds) == reference_trace_json(profile, bounds=bounds), name
    p = synthetic_profile()
    graph = dataclasses.replace(p.graphs[0], device_memory=(
        DeviceMemorySample(step=p.steps[1].index, node_id=3, allocated_bytes=4096, peak_bytes=8192, reserved_bytes=2**20),))
    with_reads = dataclasses.replace(p, graphs=(graph,))
    assert chrome_trace_json(with_reads, stat="max") == reference_trace_json(with_reads, stat="max")


def test_graphml_is_byte_identical_to_networkx_output(real: Profile) -> None:
    for name, profile in _profiles(real).items():
        assert model_typed(profile), name
        assert graphml_text(profile) == graphml_via_networkx(profile), name
    assert graphml_text(real, stat="min") == graphml_via_networkx(real, stat="min")


def test_a_field_of_another_type_than_the_model_keeps_networkx_types() -> None:
    p = synthetic_profile()
    graph = p.graphs[0]
    odd = dataclasses.replace(p, graphs=(dataclasses.replace(graph, nodes=(
        dataclasses.replace(graph.nodes[0], flops=1.5), *graph.nodes[1:])),))
    assert not model_typed(odd)
    back = nx.read_graphml(io.BytesIO(graphml_text(odd).encode("utf-8")))
    assert back.nodes["0:0"]["flops"] == 1.5 and back.nodes["0:1"]["flops"] == p.graphs[0].nodes[1].flops


def test_node_link_json_reads_back_as_the_networkx_document(real: Profile) -> None:
    for name, profile in _profiles(real).items():
        expected = json.loads(json.dumps(nx.node_link_data(profile_graph(profile), edges="edges")))
        assert json.loads(node_link_json(profile)) == expected, name


@pytest.mark.parametrize("filename", ["t.trace.json", "t.trace.json.gz", "g.graphml", "g.nodelink.json"])
def test_a_failing_streamed_write_leaves_the_old_file(filename: str, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    target = tmp_path / filename
    target.write_text("old")
    name = {"t.trace.json": "chrome", "t.trace.json.gz": "chrome-gz", "g.graphml": "graphml",
            "g.nodelink.json": "nodelink"}[filename]
    original = streamed.STREAMED[name]

    def half_then_crash(profile: Profile, options: object, f: object) -> None:
        original(profile, options, f)  # type: ignore[arg-type]
        raise RuntimeError("disk gone")

    monkeypatch.setitem(streamed.STREAMED, name, half_then_crash)
    with pytest.raises(RuntimeError):
        export_profile(synthetic_profile(), target)
    assert target.read_text() == "old" and os.listdir(tmp_path) == [filename]


def test_a_streamed_document_over_the_limit_is_refused_with_its_whole_size(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    monkeypatch.setattr(exporters, "estimated_bytes", lambda profile, fmt: None)  # only the streamed count decides
    target = tmp_path / "t.trace.json"
    export_profile(synthetic_profile(), target, max_bytes=0)
    text = target.read_text()
    target.unlink()
    with pytest.raises(ExportError, match=f"the chrome export would be {format_bytes(len(text))},"):
        export_profile(synthetic_profile(), target, max_bytes=len(text) - 1)
    assert os.listdir(tmp_path) == []
    export_profile(synthetic_profile(), target, max_bytes=len(text))
    assert target.read_text() == text


def test_the_gzip_trace_is_the_whole_trace_gzip_compressed_at_once(real: Profile, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    import gzip

    from graphprof.render import chrome_stream

    monkeypatch.setattr(chrome_stream, "CHUNK_EVENTS", 7)  # many small writes into the compressor
    for profile in (real, hostile_profile(), empty_profile()):
        target = tmp_path / "t.trace.json.gz"
        export_profile(profile, target)
        assert target.read_bytes() == gzip.compress(chrome_trace_json(profile).encode("utf-8"), 6, mtime=0)


def test_a_gzip_trace_over_the_limit_is_refused_with_its_compressed_size(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(exporters, "estimated_bytes", lambda profile, fmt: None)
    target = tmp_path / "t.trace.json.gz"
    export_profile(synthetic_profile(), target, max_bytes=0)
    packed = target.read_bytes()
    target.write_bytes(b"old")
    with pytest.raises(ExportError, match=f"the chrome-gz export would be {format_bytes(len(packed))},"):
        export_profile(synthetic_profile(), target, max_bytes=len(packed) - 1)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["t.trace.json.gz"]


def test_trace_blocks_match_the_dict_built_trace_on_uneven_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes without FLOPs or memory, a zero time, a node missing a step and a second graph: the
    column-block path and the event-by-event path (a graph with a node short of a step) both stay exact."""
    from graphprof.render import chrome_stream
    from tests.render.export_profiles import node

    monkeypatch.setattr(chrome_stream, "CHUNK_EVENTS", 2)  # blocks split mid-graph
    p = synthetic_profile()
    first = p.graphs[0]
    nodes = (*first.nodes, node(6, "add", (5,), (0.0, 1e-6, 2e-6)), node(7, "view", (6,), (3e-6, 4e-6, 5e-6), flops=None))
    short = dataclasses.replace(first, id=1, name="second", nodes=(
        node(0, "mm", (), (1e-3, 2e-3), flops=10), node(1, "relu", (0,), (1e-4, 2e-4, 3e-4), bytes_read=8)))
    uneven = dataclasses.replace(p, graphs=(dataclasses.replace(first, nodes=nodes), short))
    for bounds in (None, BOUNDS):
        assert chrome_trace_json(uneven, bounds=bounds) == reference_trace_json(uneven, bounds=bounds)
    more_steps = dataclasses.replace(p, steps=(*p.steps, dataclasses.replace(p.steps[-1], index=9)))
    assert chrome_trace_json(more_steps) == reference_trace_json(more_steps)  # a step no node has a sample of


def test_a_loaded_profile_trace_read_from_sample_arrays_is_byte_identical(tmp_path: Path) -> None:
    """A loaded graph's samples are arrays (the block path reads them without per-node tuples); the
    trace is the oracle's bytes for the same loaded profile, numbers below 1e-4 included."""
    p = synthetic_profile()
    first = p.graphs[0]
    slow = dataclasses.replace(first.nodes[0], flops=1, host_time_ns=(10**14, 2 * 10**14, 3 * 10**14))
    graph = dataclasses.replace(first, nodes=(slow, *first.nodes[1:]))
    p = dataclasses.replace(p, graphs=(graph,))
    p.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    for bounds in (None, BOUNDS):
        text = chrome_trace_json(loaded, bounds=bounds)
        assert text == reference_trace_json(loaded, bounds=bounds)
        assert '"flop_per_s":1e-05' in text


def test_export_bounds_are_those_of_the_roofline_points(real: Profile) -> None:
    """A format that shows bounds alone reads them from the roofline's arrays: the same as from its points."""
    for profile in (synthetic_profile(), real):
        opts = exporters.ExportOptions(stat="max")
        from_points = exporters.with_analysis(profile, dataclasses.replace(opts, findings=())).bounds
        assert exporters.analysed_options("chrome", profile, opts).bounds == from_points
    assert exporters.analysed_options("chrome", synthetic_profile(), exporters.ExportOptions()).bounds


def test_a_loaded_profile_is_model_typed_by_the_loaders_checks_unless_its_memory_is_stored_otherwise() -> None:
    document = json.loads(json.dumps(synthetic_profile().to_dict()))
    loaded = Profile.from_dict(document)
    assert model_typed(loaded)
    assert not node_frame(loaded)._columns  # settled without reading a column
    memory = document["graphs"][0]["columns"]["memory"]
    memory["allocated_bytes"] = {"keys": ["a"], "values": [None if v is None else [v] for v in memory["allocated_bytes"]]}
    odd = Profile.from_dict(document)  # a byte count stored as a mapping: the columns decide, and say no
    assert not model_typed(odd)
    assert graphml_text(odd) == graphml_via_networkx(odd)
