"""Loading bounds every number and checks every type: hostile values are one ProfileError sentence.

Each case is one value a malformed or hand-edited file can hold that used to
reach the analysis (and raise OverflowError or TypeError there): integers past
64 bits, 1e308 seconds, NaN, strings where numbers belong, a non-string meta
field, malformed op attributes, a null id.
"""

from __future__ import annotations

import json

import pytest

import graphprof
from graphprof.profile import ProfileError
from graphprof.profile.model import profile_from_document
from tests.profile.test_serialize import small_profile


def _document() -> dict:
    return json.loads(json.dumps(small_profile()))


def _set(doc: dict, path: str, value: object) -> dict:
    *parents, last = path.split("/")
    target = doc
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


HUGE = 10**400

CASES = [
    ("graphs/0/columns/host_time_s/by_step/0/0", HUGE, "ticks of -1e9 to 1e9 seconds"),
    ("graphs/0/columns/host_time_s/by_step/0/0", 10**30, "ticks of -1e9 to 1e9 seconds"),
    ("graphs/0/columns/host_time_s/ticks_per_s", HUGE, "ticks_per_s must be a positive integer"),
    ("graphs/0/columns/flops/0", HUGE, "columns.flops must hold integers from 0 to 2**63-1"),
    ("graphs/0/columns/bytes_read/0", -1, "columns.bytes_read must hold integers from 0 to 2**63-1"),
    ("graphs/0/columns/flops/0", 1.5, "columns.flops holds a value of the wrong type"),
    # JSON true and false are ints to a 64-bit array: every integer column still refuses them
    ("graphs/0/columns/bytes_read", [True, 7], "columns.bytes_read holds a value of the wrong type"),
    ("graphs/0/columns/op/0", True, "columns.op holds a value of the wrong type"),
    ("graphs/0/columns/host_time_s/by_step/0/0", False, "by_step holds a tick of the wrong type"),
    ("graphs/0/columns/inputs", [[], [True]], "columns.inputs holds a non-integer"),
    ("graphs/0/columns/id", [0, True], "columns.id holds a value of the wrong type"),
    ("steps/0/wall_time_s", HUGE, "steps[0].wall_time_s must be one of the times"),
    ("steps/0/wall_time_s", 1e308, "steps[0].wall_time_s must be one of the times"),
    ("steps/0/wall_time_s", float("nan"), "steps[0].wall_time_s must be one of the times"),
    ("steps/0/wall_time_s", float("inf"), "steps[0].wall_time_s must be one of the times"),
    ("steps/0/graph_time_s", "1", "steps[0].graph_time_s must be a number"),
    ("steps/0/index", HUGE, "steps[0].index must be one of the 64-bit integers"),
    ("steps/0/index", None, "steps[0].index must be an integer"),
    ("meta/device_type", 7, "meta.device_type must be a string"),
    ("meta/device_name", ["gpu"], "meta.device_name must be a string"),
    ("meta/function", None, "meta.function must be a string"),
    ("meta/probe_cost_s", 1e308, "meta.probe_cost_s must be one of the times"),
    ("meta/peaks", {"flops_per_s": float("inf")}, "meta.peaks must hold finite numbers"),
    ("meta/peaks", {"flops_per_s": "fast"}, "meta.peaks must hold numbers"),
    ("meta/extra", [], "meta.extra must be an object"),
    ("graphs/0/id", None, "graphs[0]: id must be an integer"),
    ("graphs/0/name", {"x": 1}, "graphs[0]: name must be a string"),
    ("graphs/0/columns/id", [0, None], "columns.id holds a value of the wrong type"),
    ("graphs/0/columns/id", [0, 0], "columns.id holds the same id twice"),
    ("graphs/0/columns/inputs", [[], [5]], "columns.inputs refers to a node the graph does not have"),
    ("graphs/0/columns/attrs", [[["k", None]], []], "columns.attrs must hold lists of [key, value] pairs"),
    ("graphs/0/columns/attrs", [[["k", [1]]], []], "columns.attrs must hold lists of [key, value] pairs"),
    ("graphs/0/columns/attrs", [[], "x"], "columns.attrs must hold lists of [key, value] pairs"),
    ("graphs/0/columns/memory", {"allocated_bytes": ["1", None]}, "columns.memory.allocated_bytes holds a value"),
    ("graphs/0/columns/memory", {"allocated_bytes": [1.5, None]}, "columns.memory.allocated_bytes holds a value"),
    ("graphs/0/columns/memory", {"allocated_bytes": [HUGE, None]}, "columns.memory.allocated_bytes must hold"),
    ("graphs/0/columns/memory", {"present": [1, 0], "live_by_category_bytes": {
        "keys": ["a"], "values": [[1.5], None]}}, "live_by_category_bytes.values holds a malformed entry"),
    ("graphs/0/columns/memory", {"present": [1, 0], "live_by_category_bytes": {
        "keys": ["a"], "values": [[False], None]}}, "live_by_category_bytes.values holds a malformed entry"),
    ("graphs/0/shape_sets", [[[-1, 2]]], "shape_sets holds a malformed entry"),
    ("graphs/0/memory_peak", {"node_id": 0, "live_bytes": HUGE}, "memory_peak.live_bytes must be one of the 64-bit"),
    ("graphs/0/device_memory", {"step": [0], "node_id": [0], "allocated_bytes": [float("inf")],
                                "peak_bytes": [0], "reserved_bytes": [0]}, "device_memory.allocated_bytes holds"),
]


@pytest.mark.parametrize("path, value, message", CASES, ids=[f"{c[0]}={c[1]!r:.20}" for c in CASES])
def test_every_value_is_bounded_and_typed(path: str, value: object, message: str) -> None:
    doc = _set(_document(), path, value)
    doc = json.loads(json.dumps(doc))  # through JSON text, as a file reaches the loader (NaN, Infinity)
    with pytest.raises(ProfileError, match=message.replace("*", r"\*").replace("[", r"\[")) as info:
        profile_from_document(doc)
    text = str(info.value)
    assert "\n" not in text and text.startswith("not a valid graphprof profile: ") and len(text) < 300


@pytest.mark.parametrize("values, exact", [
    ([5, -3, 2**63 - 1, -(2**63)], True), ([], True), ([0, 1, 1, 0], True), ([7] * 40 + [1], True),
    ([7] * 40 + [True], False), ([0, 1, False], False), ([3, 1.0], False), ([3, None], False),
    ([3, "4"], False), ([3, [4]], False), ([2**63], False), ([-(2**63) - 1], False)])
def test_int64_array_takes_exactly_the_ints_64_bits_hold(values: list, exact: bool) -> None:
    """The integer columns' one-pass conversion: any other value (a bool among many ints or among
    zeros and ones included) sends the column to the exact check, which names the fault."""
    from graphprof.profile.schema import int64_array

    packed = int64_array(values)
    assert (packed is not None) == exact
    if exact:
        assert packed.dtype.name == "int64" and packed.tolist() == values


@pytest.mark.parametrize("field, value", [("host_time_s", [1e308]), ("host_time_s", [HUGE]), ("flops", HUGE),
                                          ("id", None), ("attrs", [["a"]]), ("memory", {"live_bytes": "1"})])
def test_readable_layout_has_the_same_bounds(field: str, value: object) -> None:
    node = {"id": 0, "name": "relu", "op": "aten.relu.default", "type": "relu", field: value}
    doc = {"schema": "graphprof.profile/1", "graphs": [{"id": 0, "name": "g", "kind": "step", "nodes": [node]}]}
    with pytest.raises(ProfileError, match=f"graphs\\[0\\]: nodes\\[0\\].{field}"):
        profile_from_document(json.loads(json.dumps(doc)))


def test_the_largest_legal_values_load_and_analyse(tmp_path, capsys) -> None:
    """Bounds reject only what cannot be true: the extremes they allow still analyse and export."""
    from graphprof.cli import main

    doc = _document()
    cols = doc["graphs"][0]["columns"]
    cols["flops"][0] = 2**63 - 1
    cols["host_time_s"]["by_step"][0][0] = 10**9 * cols["host_time_s"]["ticks_per_s"]
    doc["steps"][0]["wall_time_s"] = 1e9
    doc["meta"]["peaks"] = {"flops_per_s": 1e30, "bytes_per_s": 1e30}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert graphprof.load(path).graphs[0].nodes[0].flops == 2**63 - 1
    for args in (["analyze", str(path)], ["report", str(path)], ["export", str(path), "-o", str(tmp_path / "s.folded")],
                 ["diff", str(path), str(path)]):
        assert main(args) == 0, args
    assert capsys.readouterr().err.count("Traceback") == 0


def test_op_attributes_round_trip(tmp_path) -> None:
    from dataclasses import replace

    profile = small_profile()
    graph = profile.graphs[0]
    attrs = (("backend", "mkldnn"), ("blocking", False), ("bytes", 4096), ("device", "cpu"), ("ratio", 0.5))
    nodes = (replace(graph.nodes[0], attrs=attrs),) + graph.nodes[1:]
    profile = replace(profile, graphs=(replace(graph, nodes=nodes),))
    path = tmp_path / "p.json"
    profile.save(str(path))
    back = graphprof.load(path)
    assert back == profile
    assert [type(v) for _, v in back.graphs[0].nodes[0].attrs] == [str, bool, int, str, float]


def test_old_text_attributes_load_typed(tmp_path) -> None:
    """Files written before attrs were typed stored counts and flags as text; they load as the values they stood for."""
    import json

    profile = small_profile()
    path = tmp_path / "p.json"
    profile.save(str(path))
    doc = json.loads(path.read_text())
    old = [["blocking", "false"], ["bytes", "4096"], ["collective", "allreduce"], ["fast_conv_available", ""],
           ["world_size", "2"], ["devices", "cuda:0,cpu"]]
    doc["graphs"][0]["columns"]["attrs"] = [old] + [[] for _ in profile.graphs[0].nodes[1:]]
    path.write_text(json.dumps(doc))
    attrs = dict(graphprof.load(path).graphs[0].nodes[0].attrs)
    assert attrs == {"blocking": False, "bytes": 4096, "collective": "allreduce", "fast_conv_available": False,
                     "world_size": 2, "devices": "cuda:0,cpu"}


def test_subnormal_times_and_peaks_read_as_zero(tmp_path, capsys) -> None:
    """5e-324 s under 2**63 FLOPs would be an infinite rate that no JSON export could write."""
    from graphprof.cli import main

    nodes = [{"id": 0, "name": "mm", "op": "aten.mm.default", "type": "mm", "flops": 2**63 - 1,
              "bytes_read": 2**63 - 1, "host_time_s": [5e-324]},
             {"id": 1, "name": "mm2", "op": "aten.mm.default", "type": "mm", "inputs": [0], "host_time_s": [1e-9]}]
    doc = {"schema": "graphprof.profile/1", "meta": {"peaks": {"flops_per_s": 5e-324, "bytes_per_s": 1e10}},
           "steps": [{"index": 0, "wall_time_s": 5e-324}],
           "graphs": [{"id": 0, "name": "g", "kind": "step", "nodes": nodes}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    profile = graphprof.load(path)
    assert profile.graphs[0].nodes[0].host_time_s == (0.0,) and profile.steps[0].wall_time_s == 0.0
    assert profile.meta.peaks["flops_per_s"] == 0.0
    for args in (["analyze", str(path), "--format", "json"], ["report", str(path)],
                 ["export", str(path), "-o", str(tmp_path / "t.trace.json")],
                 ["export", str(path), "-o", str(tmp_path / "r.html")],
                 ["diff", str(path), str(path), "--format", "json"]):
        assert main(args) == 0, (args, capsys.readouterr().err)
    json.loads((tmp_path / "t.trace.json").read_text())
