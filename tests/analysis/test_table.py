"""The profile table's analysis: statistics, filters, aggregation, ordering, edge cases.

Values are checked against what the small profile's builder put in, computed
independently here (the golden tests check the printed form).
"""

from __future__ import annotations

import math
import statistics

import pytest

from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.columns import parse_order_by
from graphprof.analysis.options import TableOptionError, TableOptions, make_options
from graphprof.analysis.table import build_table
from graphprof.profile import GraphKind, GraphRecord, NodeRecord, Phase, Profile, StepRecord
from tests.data.make_small_profile import build


@pytest.fixture(scope="module")
def small() -> Profile:
    return build()


def _nodes(profile: Profile) -> list[NodeRecord]:
    return [n for _, n in profile.iter_nodes()]


def test_per_node_rows_use_the_statistic_and_share_of_the_whole(small: Profile) -> None:
    for stat, fn in (("median", statistics.median), ("mean", statistics.fmean), ("min", min), ("max", max)):
        result = build_table(small, top=0, stat=stat)
        total = math.fsum(fn(n.host_time_s) for n in _nodes(small))
        assert result.total_time_s == pytest.approx(total)
        times = [r.time_s for r in result.rows]
        assert times == sorted(times, reverse=True)
        assert sorted(times) == pytest.approx(sorted(fn(n.host_time_s) for n in _nodes(small)))
        assert result.rows[-1].cumulative_percent == pytest.approx(100.0)
        assert sum(r.percent for r in result.rows) == pytest.approx(100.0)


def test_top_cuts_after_ordering(small: Profile) -> None:
    everything = build_table(small, top=0)
    three = build_table(small, top=3)
    assert [r.name for r in three.rows] == [r.name for r in everything.rows[:3]]
    assert three.total_rows == everything.total_rows == small.node_count


@pytest.mark.parametrize("spelling", ["addmm", "aten.addmm", "aten.addmm.default", "aten::addmm"])
def test_type_filter_accepts_every_spelling(small: Profile, spelling: str) -> None:
    result = build_table(small, top=0, type=spelling)
    assert {r.op for r in result.rows} == {"aten.addmm.default"} and len(result.rows) == 3


def test_filters_narrow_and_combine(small: Profile) -> None:
    rows = build_table(small, top=0, module=r"^encoder\.", phase="backward").rows
    assert rows and all(r.module.startswith("encoder.") and r.phase == "backward" for r in rows)
    assert {r.name for r in build_table(small, top=0, name="^mm_[13]$").rows} == {"mm_1", "mm_3"}
    assert [r.name for r in build_table(small, top=0, input_dtype="Float16").rows] == ["_to_copy"]
    assert {r.name for r in build_table(small, top=0, input_dtype="torch.int64").rows} == {"nll_loss_forward", "nll_loss_backward"}
    timed = build_table(small, top=0, min_time=3e-6, max_time=1e-5).rows
    assert timed and all(3e-6 <= r.time_s <= 1e-5 for r in timed)


def test_percentages_stay_shares_of_the_whole_profile_when_filtered(small: Profile) -> None:
    result = build_table(small, top=0, phase="optimizer")
    assert result.matched_nodes == 3
    assert result.rows[-1].cumulative_percent == pytest.approx(100 * result.matched_time_s / result.total_time_s)
    assert result.rows[-1].cumulative_percent < 100


def test_empty_selection_is_a_result_with_a_reason(small: Profile) -> None:
    result = build_table(small, type="conv")
    assert result.rows == () and result.matched_nodes == 0
    assert result.note == "no node has type 'conv'"
    near = build_table(small, type="add")
    assert "did you mean 'add_'" in near.note
    assert "no node matches --name zzz" == build_table(small, name="zzz").note


def test_aggregate_by_type_sums_and_counts(small: Profile) -> None:
    rows = {r.label: r for r in build_table(small, top=0, aggregate_by="type").rows}
    mm = [n for n in _nodes(small) if n.type == "mm"]
    assert rows["mm"].calls == len(mm) == 5
    assert rows["mm"].time_s == pytest.approx(sum(statistics.median(n.host_time_s) for n in mm))
    assert rows["mm"].flops == sum(n.flops for n in mm)
    assert rows["mm"].flop_per_s == pytest.approx(rows["mm"].flops / rows["mm"].time_s)
    assert rows["mm"].live_bytes == max(n.memory.live_bytes for n in mm)  # peak, not a sum
    assert rows["native_layer_norm"].flops is None and rows["native_layer_norm"].flop_per_s is None
    assert rows["mm"].id is None and rows["mm"].type == "mm" and rows["mm"].module is None


@pytest.mark.parametrize("fn, reduce", [("mean", statistics.fmean), ("max", max), ("min", min), ("sum", sum)])
def test_aggregate_functions(small: Profile, fn: str, reduce) -> None:
    row = {r.label: r for r in build_table(small, top=0, aggregate_by="type", aggregate=fn).rows}["add_"]
    adds = [n for n in _nodes(small) if n.type == "add_"]
    assert row.time_s == pytest.approx(reduce([statistics.median(n.host_time_s) for n in adds]))
    assert row.bytes_moved == pytest.approx(reduce([n.bytes_read + n.bytes_written for n in adds]))
    assert row.calls == 3


def test_aggregate_without_by_folds_everything_and_by_without_fn_sums(small: Profile) -> None:
    (row,) = build_table(small, aggregate="sum").rows
    assert row.label == "all" and row.calls == small.node_count and row.percent == pytest.approx(100.0)
    assert build_table(small, aggregate_by="phase").options.aggregate_fn == "sum"


def test_module_depth_groups_by_path_prefix(small: Profile) -> None:
    labels = [r.label for r in build_table(small, top=0, aggregate_by="module", module_depth=1).rows]
    assert sorted(labels) == ["", "encoder", "head", "loss", "norm"]
    shapes = build_table(small, top=0, aggregate_by="shape").rows
    assert all(r.in_shapes is not None and r.type is not None for r in shapes)


def test_unknown_values_sort_last_in_both_directions(small: Profile) -> None:
    for spec in ("flops", "+flops", "flop_per_s", "+flop_per_s", "intensity", "+bandwidth"):
        rows = build_table(small, top=0, order_by=spec).rows
        key = parse_order_by(spec).column.key
        values = [getattr(r, key) for r in rows]
        known = [v for v in values if v is not None]
        assert values[: len(known)] == known and all(v is None for v in values[len(known):])
        assert known == sorted(known, reverse=not spec.startswith("+"))


def test_zero_duration_op_has_no_rate_and_no_inf(small: Profile) -> None:
    (view,) = build_table(small, top=0, name="^view$").rows
    assert view.time_s == 0.0 and view.flop_per_s is None and view.bandwidth_bytes_per_s is None
    assert view.intensity_flop_per_byte is None  # 0 FLOP over 0 bytes


def test_ordering_by_text_and_shapes_works(small: Profile) -> None:
    names = [r.name for r in build_table(small, top=0, order_by="+name").rows]
    assert names == sorted(names)
    rows = build_table(small, top=0, order_by="in_shapes").rows
    sizes = [sum(math.prod(s) for s in r.in_shapes if s is not None) for r in rows]
    assert sizes == sorted(sizes, reverse=True)
    assert build_table(small, top=0, order_by="+out_shapes").rows


def test_memory_columns_appear_only_with_memory_records(small: Profile) -> None:
    assert "live_bytes" in build_table(small).columns
    bare = Profile(steps=(StepRecord(0, 1.0),), graphs=(GraphRecord(0, "g", GraphKind.STEP, (
        NodeRecord(id=0, name="a", op="aten.relu.default", type="relu", host_time_ns=seconds_to_ns((1e-6,))),)),))
    result = build_table(bare, order_by="live")  # orderable even when nobody has it
    assert "live_bytes" not in result.columns and result.rows[0].live_bytes is None


def test_empty_profile_gives_an_empty_table() -> None:
    result = build_table(Profile())
    assert result.rows == () and result.total_time_s == 0 and result.note is None


def test_device_clock_is_used_when_recorded() -> None:
    node = NodeRecord(id=0, name="mm", op="aten.mm.default", type="mm", phase=Phase.FORWARD, flops=100,
                      host_time_ns=seconds_to_ns((1e-6, 3e-6)), device_time_ns=seconds_to_ns((5e-6, 7e-6)))
    profile = Profile(steps=(StepRecord(0, 1.0), StepRecord(1, 1.0)),
                      graphs=(GraphRecord(0, "g", GraphKind.STEP, (node,)),))
    assert build_table(profile).rows[0].time_s == pytest.approx(6e-6)
    assert build_table(profile, clock="host").rows[0].time_s == pytest.approx(2e-6)
    with pytest.raises(TableOptionError, match="no device times"):
        build_table(build(), clock="device")


@pytest.mark.parametrize("kwargs, message", [
    ({"top": -1}, "--top must be"),
    ({"stat": "p99"}, "--stat 'p99' is not one of"),
    ({"aggregate": "median"}, "--aggregate 'median'"),
    ({"aggregate_by": "color"}, "--aggregate-by 'color'"),
    ({"phase": "warmup"}, "--phase 'warmup'"),
    ({"name": "("}, "not a valid regular expression"),
    ({"module": "[a-"}, "not a valid regular expression"),
    ({"columns": ("time", "bogus")}, "--columns: no column 'bogus'"),
    ({"width": 10}, "--width must be"),
    ({"order_by": "flopz"}, "did you mean 'flops'"),
    ({"order_by": "cumulative_percent"}, "depends on the order"),
    ({"order_by": ""}, "needs a column name"),
    ({"min_time": 1e-3, "max_time": 1e-6}, "larger than --max-time"),
    ({"module_depth": 2}, "only applies with --aggregate-by module"),
    ({"module_depth": 0, "aggregate_by": "module"}, "--module-depth must be"),
    ({"print_only": "device"}, "--print-only 'device'"),
])
def test_bad_option_values_are_one_sentence(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        make_options(**kwargs)
    assert "\n" not in str(info.value)


def test_options_object_and_keywords_agree(small: Profile) -> None:
    options = TableOptions(top=4, types=("mm",), order_by="+flops").validate()
    assert build_table(small, options) == build_table(small, top=4, type="mm", order_by="+flops")


@pytest.mark.parametrize("alias,key", [
    ("memory", "bytes_moved"), ("computation", "flops"), ("opr_id", "id"), ("flops", "flops"),
    ("self_cpu_time_total", "time_s"), ("cpu_time_total", "time_s"), ("self_cuda_time_total", "time_s"),
    ("device_time_total", "time_s"), ("cpu_memory_usage", "allocated_bytes"),
    ("self_cpu_memory_usage", "allocated_bytes"), ("self_device_memory_usage", "allocated_bytes"),
    ("count", "calls"), ("CPU_TIME_TOTAL", "time_s"),
])
def test_megengine_and_key_averages_names_order_the_table(small: Profile, alias: str, key: str) -> None:
    result = build_table(small, top=5, order_by=alias)
    assert result.order.column.key == key
    assert result.rows == build_table(small, top=5, order_by=key).rows


def test_megengine_operator_classes_select_their_aten_ops(small: Profile) -> None:
    by_class = build_table(small, top=0, type="MatrixMul")
    by_name = build_table(small, top=0, type=["mm", "addmm", "matmul"])
    assert by_class.rows and by_class.rows == by_name.rows


def test_columns_pick_json_fields_in_order(small: Profile) -> None:
    result = build_table(small, top=2, columns="time, name,memory,count")
    assert result.columns == ("time_s", "name", "bytes_moved", "calls")

