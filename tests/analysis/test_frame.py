"""The node frame gives the same columns and times whether a profile was loaded (columns) or built (records)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from graphprof.analysis.frame import moved_ints, node_frame
from graphprof.analysis.node_arrays import int_array
from graphprof.analysis.node_time import node_times_s, profile_clock
from graphprof.analysis.table import build_table
from graphprof.profile import GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase, Profile, StepRecord
from graphprof.profile.model import node_source, profile_from_document

STATS = ("median", "mean", "min", "max", "stdev")
CLOCKS = ("auto", "host", "device")


def _profile(samples: list[tuple[int, ...]], device: bool = True) -> Profile:
    """One step graph of nodes with these host samples (device samples 10x where ``device``), and a host graph."""
    nodes = tuple(
        NodeRecord(id=i, name=f"n{i}", op="aten.mm.default", type="mm", phase=Phase.BACKWARD if i % 2 else Phase.FORWARD,
                   flops=i or None, bytes_read=i, bytes_written=None if i % 3 else 2,
                   memory=MemoryRecord(allocated_bytes=i, live_bytes=100 - i) if i % 2 else None,
                   host_time_ns=s, device_time_ns=tuple(10 * t for t in s) if device else ())
        for i, s in enumerate(samples))
    host = (NodeRecord(id=0, name="grad", op="host.assign_grad", type="assign_grad",
                       host_time_ns=samples[0] if samples else ()),)
    return Profile(steps=(StepRecord(0, 1.0),),
                   graphs=(GraphRecord(4, "step", GraphKind.STEP, nodes), GraphRecord(9, "host", GraphKind.HOST, host)))


def _loaded(profile: Profile) -> Profile:
    return profile_from_document(json.loads(json.dumps(profile.to_dict())))


def _records_times(profile: Profile, stat: str, clock: str) -> list[float]:
    return node_times_s((n for g in profile.graphs for n in g.nodes), stat, clock)


@pytest.mark.parametrize("samples", [
    [(3, 1, 2, 4), (5, 5, 6, 7), (-1, 2, 3, 5)],  # an even count: the median halves the middle pair's sum
    [(7, 1, 2), (1, 1, 1), (2**53 + 1, 3, 10**16 + 1)],  # beyond float's exact integers: the Python path
    [(5,), (6,), (7,)],
    [(1, 2), (3,), ()],  # ragged: stored per node
])
@pytest.mark.parametrize("device", [True, False])
def test_times_from_columns_equal_times_from_records_bit_for_bit(samples, device) -> None:
    built = _profile(samples, device)
    loaded = _loaded(built)
    for stat in STATS:
        for clock in CLOCKS:
            expected = _records_times(built, stat, clock)
            got = node_frame(loaded).times(stat, clock)
            assert [t.hex() for t in got] == [t.hex() for t in expected], (stat, clock)
            assert node_frame(built).times(stat, clock) == expected
    assert profile_clock(loaded) == profile_clock(built)


def test_columns_of_a_loaded_profile_equal_those_of_its_records() -> None:
    built = _profile([(3, 1, 2, 4), (5, 5, 6, 7), (1, 2, 3, 5), (2, 2, 2, 2)])
    loaded = _loaded(built)
    names = ("id", "name", "op", "type", "inputs", "in_shapes", "flops", "bytes_read", "graph", "graph_index",
             "graph_id", "phase", "bytes_moved", "allocated_bytes", "freed_bytes", "live_bytes")
    for name in names:
        assert node_frame(loaded).column(name) == node_frame(built).column(name), name
    assert node_frame(loaded).column("graph_index") == [0, 0, 0, 0, 1]
    assert node_frame(loaded).column("graph_id") == [4, 4, 4, 4, 9]
    moved = node_frame(loaded).array("bytes_moved")  # the host node moves nothing known: NaN
    assert moved[:4].tolist() == [2.0, 1.0, 2.0, 5.0] and math.isnan(moved[4])
    assert node_frame(loaded).array("id").tolist() == [0, 1, 2, 3, 0]
    assert node_frame(loaded).pairs == node_frame(built).pairs


def test_a_table_of_a_loaded_profile_builds_no_records_and_equals_the_built_one() -> None:
    built = _profile([(3, 1, 2, 4), (5, 5, 6, 7), (1, 2, 3, 5), (2, 2, 2, 2)])
    loaded = _loaded(built)
    for options in ({}, {"aggregate_by": "module"}, {"stat": "mean", "clock": "host"}, {"type": "mm"}, {"name": "n[12]", "module": ""},
                    {"phase": "backward", "min_time": 1e-9}):
        assert build_table(loaded, top=3, **options).rows == build_table(built, top=3, **options).rows
    assert all(g.__dict__["nodes"] is None for g in loaded.graphs)


@pytest.mark.parametrize("largest, summed", [(2**62, True), (2**62 + 1, False)])
def test_bytes_moved_is_one_int64_sum_only_where_no_sum_leaves_int64(largest: int, summed: bool) -> None:
    nodes = tuple(NodeRecord(id=i, name=f"n{i}", op="aten.mm.default", type="mm", bytes_read=r, bytes_written=w)
                  for i, (r, w) in enumerate([(largest, 2**62 - 1), (3, 4)]))
    built = Profile(steps=(StepRecord(0, 1.0),), graphs=(GraphRecord(0, "step", GraphKind.STEP, nodes),))
    loaded = _loaded(built)
    moved = moved_ints(node_source(loaded.graphs[0]))
    assert (moved is not None) == summed
    if moved is not None:
        assert moved.dtype == np.int64 and moved.tolist() == [largest + 2**62 - 1, 7]
    assert node_frame(loaded).column("bytes_moved") == node_frame(built).column("bytes_moved")
    if summed:  # the same array is what the analyses' int64 column holds
        assert int_array(node_frame(loaded), "bytes_moved")[0].tolist() == moved.tolist()
    else:  # the column leaves int64: the analyses keep to Python's arithmetic
        with pytest.raises(ValueError):
            int_array(node_frame(loaded), "bytes_moved")
