"""Golden outputs of ``graphprof analyze`` on tests/data/small_profile.json, one per option.

The expected texts live in tests/data/golden/<case>.txt and were reviewed by
eye. After an intended change of the output, regenerate them with

    GRAPHPROF_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/analysis/test_golden.py

and review the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import graphprof
from graphprof.cli import main
from tests.data.make_small_profile import PATH, build

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
UPDATE = os.environ.get("GRAPHPROF_UPDATE_GOLDEN") == "1"

CASES: dict[str, list[str]] = {
    # rows and statistics
    "default": [],
    "top_all": ["-t", "0"],
    "top_3": ["-t", "3"],
    "stat_mean": ["--stat", "mean", "-t", "5", "--print-only", "table"],
    "stat_min": ["--stat", "min", "-t", "5"],
    "stat_max": ["--stat", "max", "-t", "5", "--print-only", "table"],
    "clock_host": ["--clock", "host", "-t", "2", "--print-only", "table"],
    # filters
    "type_three_spellings": ["--type", "addmm", "--type", "aten.mm", "--type", "aten.relu.default", "-t", "0"],
    "type_torch_profiler_spelling": ["--type", "aten::add_", "-t", "0", "--print-only", "table"],
    "name_regex": ["--name", "^mm_[0-9]", "-t", "0", "--print-only", "table"],
    "module_regex": ["--module", r"^encoder\.", "-t", "0", "--print-only", "table"],
    "input_dtype_float16": ["--input-dtype", "torch.float16"],
    "input_dtype_int64": ["--input-dtype", "Int64", "--print-only", "table"],
    "phase_backward": ["--phase", "backward", "-t", "0"],
    "phase_optimizer_and_other": ["--phase", "optimizer", "--phase", "other", "--print-only", "table"],
    "min_max_time": ["--min-time", "3e-6", "--max-time", "1e-5", "-t", "0"],
    "min_time_zero_duration_kept": ["--max-time", "0", "--print-only", "table"],
    "empty_selection": ["--type", "conv"],
    "empty_selection_dtype": ["--input-dtype", "bfloat16", "--phase", "forward", "--print-only", "table"],
    # aggregation
    "aggregate_all_sum": ["--aggregate", "sum"],
    "aggregate_all_mean": ["--aggregate", "mean", "--print-only", "table"],
    "aggregate_by_type": ["--aggregate-by", "type", "-t", "0"],
    "aggregate_by_type_mean": ["--aggregate-by", "type", "--aggregate", "mean", "-t", "0", "--print-only", "table"],
    "aggregate_by_type_max": ["--aggregate-by", "type", "--aggregate", "max", "-t", "0", "--print-only", "table"],
    "aggregate_by_type_min": ["--aggregate-by", "type", "--aggregate", "min", "-t", "0", "--print-only", "table"],
    "aggregate_by_module": ["--aggregate-by", "module", "-t", "0", "--print-only", "table"],
    "aggregate_by_module_depth_1": ["--aggregate-by", "module", "--module-depth", "1", "--print-only", "table"],
    "aggregate_by_source": ["--aggregate-by", "source", "--print-only", "table"],
    "aggregate_by_shape": ["--aggregate-by", "shape", "-t", "0", "--print-only", "table"],
    "aggregate_by_scope": ["--aggregate-by", "scope", "--print-only", "table"],
    "aggregate_by_phase": ["--aggregate-by", "phase", "--print-only", "table"],
    "aggregate_by_graph": ["--aggregate-by", "graph", "--print-only", "table"],
    "aggregate_filtered": ["--aggregate-by", "module", "--phase", "backward", "--order-by", "flops"],
    # ordering: None (N/A) last both ways, zero-duration rates N/A, text and shapes
    "order_by_flops": ["--order-by", "flops", "-t", "0", "--print-only", "table"],
    "order_by_flops_ascending": ["--order-by", "+flops", "-t", "0", "--print-only", "table"],
    "order_by_flop_rate": ["--order-by", "flop_per_s", "-t", "0", "--print-only", "table"],
    "order_by_bandwidth_ascending": ["--order-by", "+bandwidth", "-t", "0", "--print-only", "table"],
    "order_by_intensity": ["--order-by", "intensity", "-t", "6", "--print-only", "table"],
    "order_by_bytes_moved": ["--order-by", "bytes_moved", "-t", "5", "--print-only", "table"],
    "order_by_live": ["--order-by", "live", "-t", "5", "--print-only", "table"],
    "order_by_allocated": ["--order-by", "allocated_bytes", "-t", "5", "--print-only", "table"],
    "order_by_freed_ascending": ["--order-by", "+freed", "-t", "5", "--print-only", "table"],
    "order_by_id_ascending": ["--order-by", "+id", "-t", "0", "--print-only", "table"],
    "order_by_in_shapes": ["--order-by", "in_shapes", "-t", "0", "--print-only", "table"],
    "order_by_out_shapes_ascending": ["--order-by", "+out_shapes", "-t", "5", "--print-only", "table"],
    "order_by_name_ascending": ["--order-by", "+name", "-t", "5", "--print-only", "table"],
    "order_by_calls": ["--aggregate-by", "type", "--order-by", "calls", "--print-only", "table"],
    "order_by_type_in_groups": ["--aggregate-by", "module", "--order-by", "+module_type", "--print-only", "table"],
    # output
    "print_only_summary": ["--print-only", "summary"],
    "print_only_table": ["--print-only", "table"],
    "format_github": ["--format", "github", "-t", "3"],
    "format_grid": ["--format", "grid", "-t", "2"],
    "format_fancy_grid": ["--format", "fancy_grid", "-t", "2", "--aggregate-by", "phase"],
    "format_csv": ["--format", "csv", "-t", "4"],
    "format_csv_summary": ["--format", "csv", "--print-only", "summary"],
    "format_json": ["--format", "json", "-t", "2"],
    "format_json_aggregated": ["--format", "json", "--aggregate-by", "module", "--module-depth", "1",
                               "--print-only", "table"],
    "format_json_empty": ["--format", "json", "--type", "nosuch", "--print-only", "table"],
    # the MegEngine examples of the issue, in graphprof op names
    "megengine_aggregate_by_type_sum": ["-t", "5", "--aggregate-by", "type", "--aggregate", "sum"],
    "megengine_order_by_memory": ["-t", "5", "--order-by", "bytes_moved", "--min-time", "1e-6", "--type", "mm"],
    "megengine_ascending_flops": ["--order-by", "+flops", "--min-time", "1e-6", "--type", "addmm"],
    "key_averages_by_shape": ["--aggregate-by", "shape", "--order-by", "time", "-t", "10"],
    # the same commands in MegEngine's and key_averages' own vocabulary
    "megengine_memory_alias": ["-t", "5", "--order-by", "memory", "--min-time", "1e-6", "--opr-name", "^mm"],
    "megengine_type_class": ["--order-by", "+computation", "--type", "MatrixMul", "--print-only", "host"],
    "key_averages_sort_by": ["--order-by", "self_cpu_time_total", "-t", "4", "--print-only", "table"],
    "key_averages_memory": ["--order-by", "cpu_memory_usage", "-t", "4", "--print-only", "table"],
    # layout: the width, every column, chosen columns
    "width_80": ["--width", "80", "-t", "5"],
    "width_50_aggregated": ["--width", "50", "-t", "5", "--aggregate-by", "module"],
    "wide": ["--wide", "-t", "5", "--print-only", "table"],
    "columns_chosen": ["--columns", "time,name,flops,memory,count", "-t", "5", "--print-only", "table"],
}


@pytest.fixture(autouse=True)
def _terminal_of_120_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables fit the terminal: pin its width so the texts do not depend on where tests run."""
    monkeypatch.setenv("COLUMNS", "120")


def run_case(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["analyze", PATH, *args])
    out = capsys.readouterr().out
    assert code == 0
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_output(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_case(CASES[case], capsys)
    path = GOLDEN / f"{case}.txt"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(out)
    assert path.exists(), f"no golden output for {case}; run with GRAPHPROF_UPDATE_GOLDEN=1"
    assert out == path.read_text()


def test_every_golden_file_has_a_case() -> None:
    assert {p.stem for p in GOLDEN.glob("*.txt")} == set(CASES)


def test_checked_in_profile_is_what_the_script_builds() -> None:
    assert graphprof.load(PATH) == build()


@pytest.mark.parametrize("case, kwargs", [
    ("default", {}),
    ("type_three_spellings", {"type": ["addmm", "aten.mm", "aten.relu.default"], "top": 0}),
    ("aggregate_by_module_depth_1", {"aggregate_by": "module", "module_depth": 1, "print_only": "table"}),
    ("min_max_time", {"min_time": 3e-6, "max_time": 1e-5, "top": 0}),
    ("megengine_order_by_memory", {"top": 5, "order_by": "bytes_moved", "min_time": 1e-6, "type": "mm"}),
    ("format_json", {"format": "json", "top": 2}),
    ("phase_optimizer_and_other", {"phase": ("optimizer", "other"), "print_only": "table"}),
])
def test_profile_table_takes_the_same_options(case: str, kwargs: dict) -> None:
    """``Profile.table(**options)`` prints exactly what ``graphprof analyze`` prints."""
    assert graphprof.load(PATH).table(**kwargs) + "\n" == (GOLDEN / f"{case}.txt").read_text()
