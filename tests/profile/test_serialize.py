"""Profile JSON: round trips, the json.dump habit, validation with clear errors, atomic save."""

from __future__ import annotations

import json
import os

import pytest

import graphprof
from graphprof.profile import GraphKind, GraphRecord, NodeRecord, Phase, Profile, ProfileError, ProfileMeta, StepRecord
from graphprof.profile.serialize import load_profile, save_profile


def small_profile() -> Profile:
    nodes = (
        NodeRecord(id=0, name="addmm", op="aten.addmm.default", type="addmm", in_shapes=((8,), (4, 3), (3, 8)),
                   in_dtypes=("float32",) * 3, out_shapes=((4, 8),), out_dtypes=("float32",), module="fc",
                   module_type="Linear", source="model.py:3", phase=Phase.FORWARD, scope="fwd",
                   flops=384, bytes_read=176, bytes_written=128, host_time_s=(1.5e-6, 1.25e-6)),
        NodeRecord(id=1, name="relu", op="aten.relu.default", type="relu", inputs=(0,), in_shapes=((4, 8),),
                   out_shapes=((4, 8),), phase=Phase.FORWARD, is_view=False, host_time_s=(5e-7, 6e-7)),
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
    (b'{"traceEvents": []}', "Chrome trace"),
    (b'[{"name": "x", "ph": "X"}]', "Chrome trace"),
    (b'{"schema": "graphprof.profile/99"}', "unsupported profile schema version"),
    (b'{"hello": 1}', "no 'schema' field"),
    (b'{"schema": "graphprof.profile/1", "graphs": [{"nodes": [{"id": 0}]}]}', "has no 'name'"),
    (b'{"schema": "graphprof.profile/1", "graphs": [{"nodes": [{"id": 0, "name": "a", "op": "b", "type": "c", "host_time_s": ["x"]}]}]}', "finite number"),
])
def test_bad_files_give_one_sentence(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)


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
    with pytest.raises(OSError):
        save_profile(small_profile(), path)
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["p.json"]  # no temporary file left behind
    with pytest.raises(ProfileError, match="does not exist"):
        save_profile(small_profile(), tmp_path / "missing" / "p.json")
