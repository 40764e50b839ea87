"""The example command lines of the analyzer issue, on a real profile of a ResNet training step.

MegEngine's documented ``profile_analyze`` calls and torch.profiler's
``key_averages(group_by_input_shape=True).table(sort_by=..., row_limit=10)``,
translated to graphprof op names, run on a profile taken here, and each
table is checked against the profile it came from.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import graphprof
from graphprof.analysis.table import build_table
from graphprof.cli import main


@pytest.fixture(scope="module")
def real_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from graphprof.demo.steps import resnet_sgd_step

    demo = resnet_sgd_step(batch_size=2, image_size=16)
    fn = graphprof.trace(demo.step_fn)
    for i in range(4):  # eager, capture, then 2 profiled steps
        fn(*demo.make_inputs(i))
    path = tmp_path_factory.mktemp("real") / "resnet.json"
    fn.get_profile().save(str(path))
    return path


@pytest.fixture(scope="module")
def real(real_path: Path) -> graphprof.Profile:
    return graphprof.load(real_path)


def _analyze_json(path: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()  # drop what earlier commands printed
    assert main(["analyze", str(path), *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _median(node) -> float:
    return statistics.median(node.host_time_s)


def test_megengine_aggregate_by_type_sum(real_path: Path, real: graphprof.Profile, capsys) -> None:
    """``profile_analyze -t 5 --aggregate-by type --aggregate sum``."""
    assert main(["analyze", str(real_path), "-t", "5", "--aggregate-by", "type", "--aggregate", "sum"]) == 0
    assert "convolution" in capsys.readouterr().out
    rows = _analyze_json(real_path, "-t", "5", "--aggregate-by", "type", "--aggregate", "sum", capsys=capsys)["table"]["rows"]
    assert len(rows) == 5
    for row in rows:
        members = [n for _, n in real.iter_nodes() if n.type == row["label"]]
        assert row["calls"] == len(members)
        assert row["time_s"] == pytest.approx(sum(_median(n) for n in members))
    assert [r["time_s"] for r in rows] == sorted((r["time_s"] for r in rows), reverse=True)


@pytest.mark.parametrize("order_by", ["bytes_moved", "live_bytes"])
def test_megengine_order_by_memory_of_convolutions(real_path: Path, order_by: str, capsys) -> None:
    """``profile_analyze -t 5 --order-by memory --min-time 1e-4 --type ConvolutionForward``."""
    args = ["-t", "5", "--order-by", order_by, "--min-time", "1e-4", "--type", "convolution"]
    assert main(["analyze", str(real_path), *args]) == 0
    doc = _analyze_json(real_path, *args, capsys=capsys)
    rows = doc["table"]["rows"]
    assert len(rows) <= 5 and doc["summary"]["matched_nodes"] >= len(rows)
    assert all(r["type"] == "convolution" and r["time_s"] >= 1e-4 for r in rows)
    values = [r[order_by] for r in rows if r[order_by] is not None]
    assert values == sorted(values, reverse=True)
    assert [r[order_by] for r in rows][: len(values)] == values  # N/A only after known values


def test_megengine_ascending_flops_of_convolutions(real_path: Path, real: graphprof.Profile, capsys) -> None:
    """``profile_analyze --order-by +flops --min-time 1e-5 --type ConvolutionForward`` (every row: -t 0)."""
    args = ["--order-by", "+flops", "--min-time", "1e-5", "--type", "aten.convolution", "-t", "0"]
    assert main(["analyze", str(real_path), *args]) == 0
    rows = _analyze_json(real_path, *args, capsys=capsys)["table"]["rows"]
    convs = [n for _, n in real.iter_nodes() if n.type == "convolution" and _median(n) >= 1e-5]
    assert sorted(r["id"] for r in rows) == sorted(n.id for n in convs)
    known = [r["flops"] for r in rows if r["flops"] is not None]
    assert known == sorted(known) and [r["flops"] for r in rows][: len(known)] == known


def test_key_averages_group_by_input_shape(real_path: Path, real: graphprof.Profile, capsys) -> None:
    """``key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=10)``."""
    args = ["--aggregate-by", "shape", "--order-by", "time", "-t", "10"]
    assert main(["analyze", str(real_path), *args]) == 0
    assert "in shapes" in capsys.readouterr().out
    doc = _analyze_json(real_path, *args, "--print-only", "table", capsys=capsys)
    rows = doc["table"]["rows"]
    assert len(rows) == 10 and "summary" not in doc
    groups = {(n.type, n.in_shapes) for _, n in real.iter_nodes()}
    assert doc["table"]["total_rows"] == len(groups)
    for row in rows:
        shapes = tuple(tuple(s) if s is not None else None for s in row["in_shapes"])
        members = [n for _, n in real.iter_nodes() if (n.type, n.in_shapes) == (row["type"], shapes)]
        assert row["calls"] == len(members)
        assert row["time_s"] == pytest.approx(sum(_median(n) for n in members))


def test_every_option_runs_on_the_real_profile(real: graphprof.Profile) -> None:
    for kwargs in ({"aggregate_by": "module", "module_depth": 1}, {"aggregate_by": "source"},
                   {"aggregate_by": "scope"}, {"aggregate_by": "phase"}, {"aggregate_by": "graph"},
                   {"phase": "optimizer", "order_by": "+id"}, {"input_dtype": "float32", "order_by": "in_shapes"},
                   {"module": "^layer1", "order_by": "flop_per_s"}, {"name": "^convolution", "stat": "max"},
                   {"order_by": "intensity", "top": 0}, {"max_time": 1e-5, "order_by": "bandwidth"}):
        result = build_table(real, **kwargs)
        assert result.rows, kwargs
        assert all(r.time_s >= 0 and r.flop_per_s != float("inf") for r in result.rows), kwargs


def test_python_m_graphprof_analyze_on_a_real_profile(real_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(real_path), "-t", "5"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "top 5 of" in proc.stdout and "backward time" in proc.stdout
