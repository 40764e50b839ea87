"""One time per node for a statistic and a clock, whichever view shows it."""

from __future__ import annotations

import pytest

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.node_time import node_time_s, profile_clock
from graphprof.analysis.table import build_table
from graphprof.profile import GraphKind, GraphRecord, NodeRecord, Profile, StepRecord


def _host_beside_device() -> Profile:
    """A device-timed step graph and a host graph (gradient bookkeeping) with host times only."""
    mm = NodeRecord(id=0, name="mm", op="aten.mm.default", type="mm",
                    host_time_ns=(10_000, 12_000), device_time_ns=(100_000, 100_000))
    host = NodeRecord(id=0, name="assign new .grad", op="host.assign_grad", type="assign_grad",
                      host_time_ns=(2_000_000, 2_000_000))
    return Profile(steps=(StepRecord(0, 0.003), StepRecord(1, 0.003)),
                   graphs=(GraphRecord(0, "step", GraphKind.STEP, (mm,)),
                           GraphRecord(1, "host", GraphKind.HOST, (host,))))


def test_node_time_is_integer_ns_divided_once() -> None:
    node = NodeRecord(id=0, name="a", op="aten.mm.default", type="mm", host_time_ns=(1500, 1250, 2000))
    assert node_time_s(node) == 1.5e-6
    assert node_time_s(node, "min", "host") == 1.25e-6
    assert node_time_s(node, "median", "device") == 0.0


def test_host_node_beside_device_graph_has_one_time_in_table_and_report() -> None:
    """The clock bug: the table picked the device clock for the whole profile and showed the host
    graph's node as 0 s while the report's critical path (per node) gave it 2 ms."""
    profile = _host_beside_device()
    assert profile_clock(profile) == "auto"
    table = build_table(profile, top=0)
    by_name = {row.name: row.time_s for row in table.rows}
    assert by_name["assign new .grad"] == pytest.approx(2e-3)
    assert by_name["mm"] == pytest.approx(1e-4)  # the device-timed node stays on the device clock
    host_path = [p for p in critical_paths(profile) if p.graph_id == 1][0]
    assert host_path.length_s == pytest.approx(by_name["assign new .grad"])
    assert table.total_time_s == pytest.approx(2e-3 + 1e-4)


def test_explicit_clocks_stay_one_clock_for_every_node() -> None:
    profile = _host_beside_device()
    host = {r.name: r.time_s for r in build_table(profile, top=0, clock="host").rows}
    device = {r.name: r.time_s for r in build_table(profile, top=0, clock="device").rows}
    assert host == pytest.approx({"mm": 11e-6, "assign new .grad": 2e-3})
    assert device == pytest.approx({"mm": 1e-4, "assign new .grad": 0.0})
