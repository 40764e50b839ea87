"""Chrome/Perfetto trace: valid Trace Event Format, durations that add up to the profile's times."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from graphprof.analysis.critical_path import critical_paths
from graphprof.api import Profile
from graphprof.profile.model import DeviceMemorySample
from graphprof.render.chrome_trace import CRITICAL_CNAME, chrome_trace, chrome_trace_json
from tests.render.export_profiles import HOSTILE, empty_profile, hostile_profile, synthetic_profile


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def assert_valid_trace(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event has the fields its phase requires, with the right types (JSON Object Format)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    events = doc["traceEvents"]
    for e in events:
        assert isinstance(e.get("name"), str), e
        assert e.get("ph") in ("X", "M", "C"), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert _number(e.get("ts")) and e["ts"] >= 0, e
        assert isinstance(e.get("args", {}), dict), e
        if e["ph"] == "X":
            assert _number(e.get("dur")) and e["dur"] >= 0, e
            assert isinstance(e.get("cat", ""), str)
        if e["ph"] == "C":
            assert e["args"] and all(_number(v) for v in e["args"].values()), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
    return events


def _node_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and e.get("cat") != "step"]


def test_real_trace_is_valid_and_durations_sum_to_the_samples(real: Profile) -> None:
    doc = json.loads(chrome_trace_json(real))
    events = assert_valid_trace(doc)
    nodes = _node_events(events)
    samples = [t for _, n in real.iter_nodes() for t in n.host_time_s]
    assert len(nodes) == len(samples) == real.node_count * len(real.steps)
    assert sum(e["dur"] for e in nodes) == pytest.approx(sum(samples) * 1e6, rel=1e-9)
    for k, step in enumerate(real.steps):  # each step's events add up to that step's node samples
        in_step = [e["dur"] for e in nodes if e["args"]["step"] == step.index]
        assert sum(in_step) == pytest.approx(sum(n.host_time_s[k] for _, n in real.iter_nodes()) * 1e6, rel=1e-9)


def test_one_track_per_graph_and_phase_and_steps_enclose_their_nodes() -> None:
    p = synthetic_profile()
    events = assert_valid_trace(chrome_trace(p))
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["step · backward", "step · forward", "step · optimizer", "steps"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == ["step 2", "step 3", "step 4"]
    for a, b in zip(steps, steps[1:]):  # laid end to end
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    for e in _node_events(events):
        span = next(s for s in steps if s["args"]["step"] == e["args"]["step"])
        assert span["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-6
        phase = e["cat"]
        assert names[e["tid"]] == f"step · {phase}"


def test_args_carry_op_shapes_flops_bytes_rates_module_and_source() -> None:
    p = synthetic_profile()
    first = next(e for e in _node_events(chrome_trace(p)["traceEvents"]) if e["args"]["node"] == 0)
    args = first["args"]
    assert args["op"] == "aten.mm.default" and args["module"] == "fc1" and args["source"] == "model.py:10"
    assert args["in_shapes"] == "[8, 16], [16, 32]" and args["flops"] == 8192
    assert args["bytes_read"] == 2560 and args["bytes_written"] == 1024
    assert args["flop_per_s"] == pytest.approx(8192 / 2e-3)
    assert args["bandwidth_bytes_per_s"] == pytest.approx(3584 / 2e-3)


def test_critical_path_nodes_are_marked_and_bounds_shown_when_given() -> None:
    p = synthetic_profile()
    (cp,) = critical_paths(p)
    events = _node_events(chrome_trace(p, bounds={(0, 3): "compute", 1: "memory"})["traceEvents"])
    for e in events:
        on_path = e["args"]["node"] in cp.node_set
        assert e["args"]["critical_path"] is on_path
        assert (e.get("cname") == CRITICAL_CNAME) is on_path
    bounds = {e["args"]["node"]: e["args"].get("bound") for e in events}
    assert bounds[3] == "compute" and bounds[1] == "memory" and bounds[0] is None


def _series(node: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in node.memory.live_by_category_bytes.items()} or {"live": node.memory.live_bytes}


def test_memory_counters_follow_each_node_where_the_series_changes() -> None:
    p = synthetic_profile()
    events = chrome_trace(p)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    changes = [s for i, s in enumerate(map(_series, p.graphs[0].nodes)) if i == 0 or s != _series(p.graphs[0].nodes[i - 1])]
    assert [e["args"] for e in counters] == changes * len(p.steps)
    # Each sits where its node ends.
    ends = {(e["args"]["step"], e["ts"] + e["dur"]) for e in _node_events(events)}
    assert all(any(ts == pytest.approx(c["ts"]) for _, ts in ends) for c in counters)
    first = counters[0]["args"]
    assert first == {"activations": 1000, "parameters": 4000}
    assert chrome_trace(empty_profile())["traceEvents"]  # metadata only, still a valid document
    assert_valid_trace(chrome_trace(empty_profile()))


def test_a_repeated_series_is_left_out_and_a_change_back_is_written() -> None:
    p = synthetic_profile()
    graph = p.graphs[0]
    first = graph.nodes[0].memory
    other = dataclasses.replace(first, live_bytes=first.live_bytes + 1,
                                live_by_category_bytes={**first.live_by_category_bytes, "activations": 1})
    memories = [first, first, other, first] + [first] * (len(graph.nodes) - 4)
    nodes = tuple(dataclasses.replace(n, memory=m) for n, m in zip(graph.nodes, memories))
    trace = chrome_trace(dataclasses.replace(p, graphs=(dataclasses.replace(graph, nodes=nodes),)))
    counters = [e["args"]["activations"] for e in trace["traceEvents"] if e["ph"] == "C"]
    a = first.live_by_category_bytes["activations"]
    assert counters == [a, 1, a] * len(p.steps)  # each step's first node writes its series again


def test_device_memory_samples_become_a_counter_track() -> None:
    p = synthetic_profile()
    graph = dataclasses.replace(p.graphs[0], device_memory=(
        DeviceMemorySample(step=p.steps[1].index, node_id=3, allocated_bytes=4096, peak_bytes=8192, reserved_bytes=2**20),))
    events = chrome_trace(dataclasses.replace(p, graphs=(graph,)))["traceEvents"]
    (read,) = [e for e in events if e["name"] == "device memory (bytes)"]
    assert read["args"] == {"allocated": 4096, "reserved": 2**20}
    (mm,) = [e for e in _node_events(events) if e["args"]["node"] == 3 and e["args"]["step"] == p.steps[1].index]
    assert read["ts"] == pytest.approx(mm["ts"] + mm["dur"])  # read after the node, in that step


def test_hostile_names_survive_json_exactly() -> None:
    doc = json.loads(chrome_trace_json(hostile_profile()))
    events = assert_valid_trace(doc)
    node = _node_events(events)[0]
    assert node["name"] == HOSTILE and node["args"]["module"] == HOSTILE and node["args"]["source"] == HOSTILE
    counter = next(e for e in events if e["ph"] == "C")
    assert HOSTILE in counter["args"]
