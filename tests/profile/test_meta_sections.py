"""Typed meta sections (schedule, device, distributed, peaks note) keep the file's ``meta.extra`` layout."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import graphprof
from graphprof.profile.model import DeviceInfo, DistributedInfo, Recompile, ScheduleInfo
from tests.profile.test_serialize import small_profile

#: ``meta.extra`` as files have always written it (a rank of a DDP run under a schedule, on a GPU).
OLD_EXTRA = {
    "schedule": {"skip_first": 1, "wait": 0, "warmup": 1, "active": 3, "repeat": 2}, "cycle": 1,
    "timing": "pipelined", "device": "cuda:0", "device_capability": "sm_90", "device_mark_cost_s": 2e-6,
    "distributed": {"rank": 1, "world_size": 2, "backend": "nccl", "host": "node7", "ddp_buckets_timed": True,
                    "fsdp": {"modules": 3, "steps": {}}},
    "peaks_note": "peaks measured with 4 threads", "workspace": "measured", "note": "x",
    "recompiles": [{"call": 5, "graphs": "segment 0 forward", "reason": "x.size()[0] == 4", "compile_time_s": 0.25}],
}


def _with_extra(tmp_path, extra: dict) -> graphprof.Profile:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    doc = json.loads(path.read_text())
    doc["meta"]["extra"] = extra
    path.write_text(json.dumps(doc))
    return graphprof.load(path)


def test_old_extra_keys_load_as_typed_sections_and_save_back_unchanged(tmp_path) -> None:
    profile = _with_extra(tmp_path, OLD_EXTRA)
    meta = profile.meta
    assert meta.schedule == ScheduleInfo(skip_first=1, wait=0, warmup=1, active=3, repeat=2, cycle=1)
    assert meta.device == DeviceInfo(timing="pipelined", device="cuda:0", capability="sm_90", mark_cost_s=2e-6)
    assert meta.distributed == DistributedInfo(rank=1, world_size=2, backend="nccl", host="node7",
                                               fsdp={"modules": 3, "steps": {}}, details={"ddp_buckets_timed": True})
    assert meta.peaks_note == "peaks measured with 4 threads"
    assert meta.recompiles == (Recompile(5, "segment 0 forward", "x.size()[0] == 4", 0.25),)
    assert dict(meta.extra) == {"workspace": "measured", "note": "x"}  # only what has no typed field
    out = tmp_path / "again.json"
    profile.save(str(out))
    assert json.loads(out.read_text())["meta"]["extra"] == OLD_EXTRA
    assert graphprof.load(out) == profile


def test_a_merged_profile_round_trips_its_rank_layout(tmp_path) -> None:
    info = DistributedInfo(merged=True, world_size=4, backend="gloo", missing_ranks=(1, 3),
                           ranks=({"rank": 0, "graph_ids": [0]}, {"rank": 2, "graph_ids": [1]}))
    profile = replace(small_profile(), meta=replace(small_profile().meta, distributed=info))
    path = tmp_path / "m.json"
    profile.save(str(path))
    written = json.loads(path.read_text())["meta"]["extra"]["distributed"]
    assert written == {"merged": True, "world_size": 4, "backend": "gloo", "missing_ranks": [1, 3],
                       "ranks": [{"rank": 0, "graph_ids": [0]}, {"rank": 2, "graph_ids": [1]}]}
    assert graphprof.load(path) == profile


def test_sections_of_the_wrong_type_stay_in_extra_as_they_were(tmp_path) -> None:
    """A hand-edited file still loads; the code that needs a value refuses it with its own sentence."""
    from graphprof.profile.merge import merge_profiles
    from graphprof.profile.model import ProfileError

    odd = {"schedule": {"active": "3"}, "timing": 5, "peaks_note": 1, "distributed": {"rank": "0", "world_size": 2},
           "recompiles": [{"call": "5"}]}
    profile = _with_extra(tmp_path, odd)
    assert (profile.meta.schedule, profile.meta.device, profile.meta.peaks_note, profile.meta.recompiles) == (
        None, None, "", None)
    assert profile.meta.distributed == DistributedInfo(world_size=2, details={"rank": "0"})
    assert dict(profile.meta.extra) == {"schedule": {"active": "3"}, "timing": 5, "peaks_note": 1,
                                        "recompiles": [{"call": "5"}]}
    with pytest.raises(ProfileError, match="has no rank"):
        merge_profiles([profile])
