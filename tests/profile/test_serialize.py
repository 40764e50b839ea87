"""Profile JSON: round trips, the json.dump habit, validation with clear errors, atomic save."""

from __future__ import annotations

import json
import os

import pytest

import graphprof
from graphprof.profile.records import seconds_to_ns
from graphprof.profile import GraphKind, GraphRecord, NodeRecord, Phase, Profile, ProfileError, ProfileMeta, StepRecord
from graphprof.profile.model import load_profile, profile_from_document, require_samples, save_profile


def small_profile() -> Profile:
    nodes = (
        NodeRecord(id=0, name="addmm", op="aten.addmm.default", type="addmm", in_shapes=((8,), (4, 3), (3, 8)),
                   in_dtypes=("float32",) * 3, out_shapes=((4, 8),), out_dtypes=("float32",), module="fc",
                   module_type="Linear", source="model.py:3", phase=Phase.FORWARD, scope="fwd",
                   flops=384, bytes_read=176, bytes_written=128, host_time_ns=seconds_to_ns((1.5e-6, 1.25e-6))),
        NodeRecord(id=1, name="relu", op="aten.relu.default", type="relu", inputs=(0,), in_shapes=((4, 8),),
                   out_shapes=((4, 8),), phase=Phase.FORWARD, is_view=False, host_time_ns=seconds_to_ns((5e-7, 6e-7))),
    )
    return Profile(
        meta=ProfileMeta(function="step", created_at="2026-11-21T00:00:00", extra={"note": "x"}),
        steps=(StepRecord(index=2, wall_time_s=3e-6, graph_time_s=2e-6), StepRecord(index=3, wall_time_s=2.9e-6)),
        graphs=(GraphRecord(id=0, name="step", kind=GraphKind.STEP, nodes=nodes),),
    )


def test_round_trip_unchanged(tmp_path) -> None:
    profile = small_profile()
    path = tmp_path / "p.json"
    profile.save(str(path))
    loaded = graphprof.load(path)
    assert loaded == profile
    assert isinstance(loaded, graphprof.Profile)


def test_json_dump_habit_gives_a_loadable_file(tmp_path) -> None:
    profile = small_profile()
    path = tmp_path / "dumped.json"
    with open(path, "w") as f:
        json.dump(profile, f)
    assert graphprof.load(path) == profile
    assert json.loads(json.dumps(profile)) == json.loads(path.read_text())
    assert profile["schema"] == "graphprof.profile/1" and "graphs" in profile


def test_profile_is_read_only() -> None:
    with pytest.raises(TypeError):
        small_profile()["x"] = 1


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"not json at all", "is not JSON"),
    (b'{"schema": "graphprof.profile/1", "graphs": [', "truncated"),
    (b'{"schema": "graphprof.profile/1", "meta": {"function": "train_st', "truncated"),
    ('{"schema": "graphprof.profile/1", "meta": {"function": "\u00e9t\u00e9'.encode()[:-1], "truncated"),
    (b'{"schema": "graphprof.profile/1", "meta": {"function": "a\x01b"}}', "is not JSON"),
    (b'{"traceEvents": []}', "Chrome trace"),
    (b'[{"name": "x", "ph": "X"}]', "Chrome trace"),
    (b'{"schema": "graphprof.profile/99"}', "unsupported profile schema version"),
    (b'{"hello": 1}', "no 'schema' field"),
    (b'{"schema": "graphprof.profile/1", "graphs": [{"nodes": [{"id": 0}]}]}', "has no 'name'"),
    (b'{"schema": "graphprof.profile/1", "graphs": [{"nodes": [{"id": 0, "name": "a", "op": "b", "type": "c", "host_time_s": ["x"]}]}]}', "host_time_s must hold numbers"),
])
def test_bad_files_give_one_sentence(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)  # diff and merge read several files: the sentence says which


def test_a_profile_cut_anywhere_is_called_truncated(tmp_path) -> None:
    """A copy or write cut off at any byte (in a string, a number, a literal, a UTF-8 character) says so."""
    data = json.dumps(small_profile(), ensure_ascii=False).replace("relu", "r\u00e9lu").encode()
    path = tmp_path / "cut.json"
    for end in range(1, len(data) - 1, max(1, len(data) // 400)):
        path.write_bytes(data[:end])
        with pytest.raises(ProfileError, match="is truncated JSON") as info:
            load_profile(path)
        assert "\n" not in str(info.value), end


def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "nope.json")
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(tmp_path)


def test_save_is_atomic_and_keeps_old_file_on_failure(tmp_path, monkeypatch) -> None:
    path = tmp_path / "p.json"
    path.write_text("previous")
    import graphprof.profile.serialize as ser

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ser.json, "dump", boom)
    with pytest.raises(ProfileError, match=r"cannot write .*p\.json: disk full") as info:
        save_profile(small_profile(), path)
    assert ".graphprof-" not in str(info.value)  # the error names the file, not the temporary one
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["p.json"]  # no temporary file left behind
    with pytest.raises(ProfileError, match="does not exist"):
        save_profile(small_profile(), tmp_path / "missing" / "p.json")


# -- the compact column layout ---------------------------------------------------
def _varied_profile() -> Profile:
    """Every field away from its default somewhere: ids not 0..n-1, ragged samples, device times, views."""
    from graphprof.profile import MemoryRecord

    nodes = (
        NodeRecord(id=10, name="mm", op="aten.mm.default", type="mm", in_shapes=((4, 3), (3, 8)),
                   in_dtypes=("float32", "float32"), out_shapes=((4, 8),), out_dtypes=("float32",),
                   module="a.b", module_type="Linear", source="m.py:1", phase=Phase.BACKWARD, scope="s",
                   flops=384, bytes_read=176, bytes_written=None,
                   memory=MemoryRecord(allocated_bytes=128, freed_bytes=0, live_bytes=1 << 40,
                                       live_by_category_bytes={"activations": 128}),
                   host_time_ns=seconds_to_ns((1.5e-6, 1.25e-6, 2e-6)), device_time_ns=seconds_to_ns((3e-6, 3e-6, 3.5e-6))),
        NodeRecord(id=12, name="t", op="aten.t.default", type="t", inputs=(10,), in_shapes=((4, 8),),
                   out_shapes=((8, 4), None), is_view=True, host_time_ns=seconds_to_ns((0.0,))),
        NodeRecord(id=13, name="getitem", op="aten.split.Tensor", type="split", inputs=(12, 10),
                   host_time_ns=seconds_to_ns(())),
    )
    return Profile(steps=(StepRecord(index=0, wall_time_s=1.0),),
                   graphs=(GraphRecord(id=3, name="bwd", kind=GraphKind.BACKWARD, nodes=nodes),
                           GraphRecord(id=4, name="empty", kind=GraphKind.SEGMENT)))


def test_compact_layout_round_trips_every_field(tmp_path) -> None:
    profile = _varied_profile()
    path = tmp_path / "p.json"
    profile.save(str(path))
    assert graphprof.load(path) == profile
    graph = json.loads(path.read_text())["graphs"][0]
    assert graph["columns"]["inputs"] == [[], [2], [1, 3]]  # id differences
    assert "by_node" in graph["columns"]["host_time_s"]  # ragged samples
    assert graph["strings"][0] == ""


def test_readable_node_object_layout_still_loads() -> None:
    doc = {"schema": "graphprof.profile/1", "steps": [{"index": 0, "wall_time_s": 1.0}],
           "graphs": [{"id": 0, "name": "step", "kind": "step", "nodes": [
               {"id": 0, "name": "relu", "op": "aten.relu.default", "type": "relu", "phase": "forward",
                "in_shapes": [[2, 3]], "flops": 6, "host_time_s": [1e-6]}]}]}
    node = profile_from_document(doc).graphs[0].nodes[0]
    assert node.flops == 6 and node.in_shapes == ((2, 3),) and node.phase is Phase.FORWARD


def _compact(**column_overrides) -> dict:
    doc = json.loads(json.dumps(small_profile()))
    doc["graphs"][0]["columns"].update(column_overrides)
    return doc


@pytest.mark.parametrize("overrides, message", [
    ({"name": ["only one"]}, "columns.name must be a list of 2 values"),
    ({"op": [0, 99]}, "columns.op refers past its table"),
    ({"type": ["addmm", "relu"]}, "columns.type holds a value of the wrong type"),
    ({"flops": [1.5, None]}, "columns.flops holds a value of the wrong type"),
    ({"phase": [0, 0]}, "unknown phase"),
    ({"in_shapes": [0, 7]}, "columns.in_shapes refers past its table"),
    ({"host_time_s": {"ticks_per_s": 0, "by_step": []}}, "ticks_per_s must be a positive integer"),
    ({"host_time_s": {"ticks_per_s": 10, "by_step": [[1, "x"]]}}, "wrong type"),
    ({"inputs": [[], ["a"]]}, "columns.inputs holds a non-integer"),
    ({"memory": {"allocated_bytes": [1]}}, "columns.memory.allocated_bytes must be a list of 2 values"),
])
def test_malformed_columns_give_one_sentence(overrides: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as info:
        profile_from_document(_compact(**overrides))
    assert "\n" not in str(info.value) and str(info.value).startswith("not a valid graphprof profile: graphs[0]")


def test_compact_file_is_small(tmp_path) -> None:
    from tests.data.make_small_profile import build

    path = tmp_path / "p.json"
    profile = build()
    profile.save(str(path))
    per_node_step = path.stat().st_size / profile.node_count / len(profile.steps)
    assert per_node_step < 300  # the analyzer's budget (benchmarks/analyze_scale.py measures 100,000 nodes)


def test_require_samples_names_what_is_missing() -> None:
    with pytest.raises(ProfileError, match="has no graph nodes"):
        require_samples(Profile(steps=(StepRecord(0, 1.0),)), "x.json")
    with pytest.raises(ProfileError, match="has no profiled steps"):
        require_samples(Profile(graphs=small_profile().graphs), "x.json")
    require_samples(small_profile(), "x.json")
