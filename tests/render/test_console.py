"""Console, CSV and JSON rendering of profile tables: units, N/A, formats, empty profiles."""

from __future__ import annotations

import csv
import io
import json

import pytest

import graphprof
from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.options import TableOptionError
from graphprof.analysis.table import build_table
from graphprof.render.console import check_format, render_table, table_formats
from graphprof.render.units import format_bytes, format_count, format_number, format_shapes, format_time
from tests.data.make_small_profile import build


def test_units_scale_for_humans() -> None:
    assert format_time(1.5e-6) == "1.5 us" and format_time(0.25) == "250 ms" and format_time(3e-9) == "3 ns"
    assert format_time(0.0) == "0 ns" and format_time(12.5) == "12.5 s"
    assert format_time(999.96e-6) == "1 ms"  # rounding moves to the next unit, not "1e+03 us"
    assert format_count(2.5e9, "FLOP") == "2.5 GFLOP" and format_count(3e15, "FLOP/s") == "3 PFLOP/s"
    assert format_count(999.6, "FLOP") == "1 KFLOP" and format_count(0, "FLOP") == "0 FLOP"
    assert format_bytes(3 * 2**20) == "3 MiB" and format_bytes(5 * 2**30, "B/s") == "5 GiB/s"
    assert format_bytes(100) == "100 B" and format_number(1 / 12) == "0.0833"


def test_unknown_and_infinite_values_are_na() -> None:
    for fn in (format_time, format_number, lambda v: format_count(v, "FLOP"), format_bytes):
        assert fn(None) == "N/A" and fn(float("inf")) == "N/A" and fn(float("nan")) == "N/A"


def test_shapes_fit_their_width() -> None:
    shapes = ((8, 32), (8, 32), (8, 1), (8, 1), (32,), (32,))
    assert format_shapes(shapes) == "[8, 32], [8, 32], [8, 1], +3"
    assert format_shapes(shapes, limit=None, width=24) == "[8, 32], [8, 32], +4"
    assert format_shapes(((), None)) == "[], -" and format_shapes(None) == "*"


def test_csv_and_json_give_raw_si_numbers() -> None:
    result = build_table(build(), top=0, format="csv")
    rows = list(csv.DictReader(io.StringIO(render_table(result))))
    by_name = {r["name"]: r for r in rows}
    assert float(by_name["addmm_1"]["time_s"]) == pytest.approx(20e-6)
    assert by_name["addmm_1"]["flops"] == "16384" and by_name["native_layer_norm"]["flops"] == ""
    assert by_name["view"]["flop_per_s"] == ""  # zero-duration op: no rate, never inf
    doc = json.loads(render_table(build_table(build(), top=0, format="json")))
    rows = {r["name"]: r for r in doc["table"]["rows"]}
    assert rows["addmm_1"]["time_s"] == pytest.approx(20e-6) and rows["view"]["flop_per_s"] is None
    assert rows["addmm_1"]["in_shapes"] == [[32], [8, 32], [32, 32]]
    assert doc["summary"]["total_flops"] == sum(n.flops or 0 for _, n in build().iter_nodes())


def test_every_tabulate_format_renders() -> None:
    profile = build()
    for fmt in table_formats():
        text = render_table(build_table(profile, top=2, format=fmt))
        assert "encoder.fc2" in text, fmt  # the top node's module (no character any format escapes)


def test_unknown_format_is_one_sentence() -> None:
    with pytest.raises(TableOptionError, match="--format 'xlsx' is unknown"):
        check_format("xlsx")


@pytest.mark.parametrize("fmt", ["simple", "csv", "json"])
def test_empty_profile_renders(fmt: str) -> None:
    text = graphprof.Profile().table(format=fmt)
    if fmt == "json":
        assert json.loads(text)["table"]["rows"] == []
    elif fmt == "csv":
        assert text.startswith("rank,label,calls,time_s")
    else:
        assert "0 nodes" in text and "no rows" in text


def test_profile_table_on_a_profile_without_costs() -> None:
    """A profile taken before the cost pass existed: every FLOP figure is N/A, nothing crashes."""
    from graphprof.profile import GraphKind, GraphRecord, NodeRecord, StepRecord

    nodes = (NodeRecord(id=0, name="relu", op="aten.relu.default", type="relu", host_time_ns=seconds_to_ns((1e-6,))),)
    text = graphprof.Profile(steps=(StepRecord(0, 1e-5),), graphs=(GraphRecord(0, "g", GraphKind.STEP, nodes),)).table(
        order_by="flops")
    assert "N/A (no node has a FLOP count)" in text and "relu" in text
