"""`graphprof diff`: output formats, table options, the --fail-if-slower exit status, one-line errors."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphprof.cli import main
from tests.analysis.test_diff import BASE, F, _profile


def _save(tmp_path: Path, name: str, specs=BASE, walls=(1e-3, 1e-3, 1e-3)) -> str:
    path = tmp_path / name
    _profile(specs, walls=walls).save(str(path))
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    slower_mm = [s if s[0] != "mm" else (*s[:5], s[5] * 4) for s in BASE]
    inserted = BASE[:2] + [("mul", "act", F, ((4, 8),), 32, 3e-6)] + BASE[2:]
    return {
        "base": _save(tmp_path, "base.json"),
        "copy": _save(tmp_path, "copy.json"),
        "slower_mm": _save(tmp_path, "slower_mm.json", slower_mm),
        "inserted": _save(tmp_path, "inserted.json", inserted),
        "steady": _save(tmp_path, "steady.json", walls=(1.00e-3, 1.01e-3, 0.99e-3, 1.02e-3, 0.98e-3)),
        "regressed": _save(tmp_path, "regressed.json", walls=(1.20e-3, 1.21e-3, 1.19e-3, 1.22e-3, 1.18e-3)),
        "noisy_before": _save(tmp_path, "noisy_before.json", walls=(1.0e-3, 1.3e-3, 0.7e-3, 1.2e-3, 0.8e-3)),
        "noisy_after": _save(tmp_path, "noisy_after.json", walls=(1.1e-3, 1.4e-3, 0.8e-3, 1.3e-3, 0.9e-3)),
        "faster": _save(tmp_path, "faster.json", walls=(0.5e-3, 0.51e-3, 0.49e-3)),
    }


def test_identical_profiles_print_no_change_and_exit_0(files, capsys) -> None:
    assert main(["diff", files["base"], files["copy"]]) == 0
    out = capsys.readouterr().out
    assert "no changed nodes" in out and "7 matched, 0 modified" in out and "by module: no change" in out


def test_changed_and_added_nodes_are_listed_by_time_change(files, capsys) -> None:
    assert main(["diff", files["base"], files["slower_mm"], "--print-only", "table", "-t", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "top 1 of 2 changed nodes" in lines[0] and "mm" in lines[3] and "fc1" in lines[3]  # 12 us > 6 us
    assert main(["diff", files["base"], files["inserted"]]) == 0
    out = capsys.readouterr().out
    assert "1 added" in out and "added" in out.split("changed node")[1] and "mul" in out


def test_json_and_csv_are_machine_readable(files, capsys) -> None:
    assert main(["diff", files["base"], files["inserted"], "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "graphprof.diff/1" and doc["summary"]["counts"]["added"] == 1
    (row,) = doc["nodes"]["rows"]
    assert row["status"] == "added" and row["type"] == "mul" and row["before_time_s"] is None
    assert row["delta_time_s"] == pytest.approx(3e-6) and row["delta_flops"] == 32
    assert [g["key"] for g in doc["aggregates"]["type"]] == ["mul"]
    assert main(["diff", files["base"], files["slower_mm"], "--format", "csv", "--aggregate-by", "phase"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["by"], r["key"], r["before_nodes"]) for r in rows] == [("phase", "backward", "3")]
    assert float(rows[0]["delta_time_s"]) == pytest.approx(18e-6)
    assert main(["diff", files["base"], files["slower_mm"], "--format", "csv", "--print-only", "summary"]) == 0
    summary = dict(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert summary["before_nodes"] == "7" and float(summary["delta_time_s"]) == pytest.approx(18e-6)


def test_table_options_filter_and_group(files, capsys) -> None:
    assert main(["diff", files["base"], files["slower_mm"], "--phase", "forward", "--print-only", "table"]) == 0
    assert "no changed nodes" in capsys.readouterr().out
    assert main(["diff", files["base"], files["slower_mm"], "--aggregate-by", "module", "--print-only", "table",
                 "--stat", "min", "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("by module: 2 changed groups") and "| fc1 " in out and "| fc2 " in out
    assert main(["diff", files["base"], files["slower_mm"], "--type", "conv"]) == 0
    assert "no node has type 'conv'" in capsys.readouterr().out


@pytest.mark.parametrize("before, after, expected", [
    ("steady", "regressed", 1),          # 20% slower, far beyond the steps' spread
    ("noisy_before", "noisy_after", 0),  # 10% slower, within the noise
    ("steady", "faster", 0),
])
def test_fail_if_slower_exit_status(files, capsys, before, after, expected) -> None:
    assert main(["diff", files[before], files[after], "--fail-if-slower", "5%"]) == expected
    out = capsys.readouterr().out
    assert ("regression gate: FAIL" in out) == (expected == 1)


def test_fail_if_slower_keeps_json_valid_and_reports_on_stderr(files, capsys) -> None:
    assert main(["diff", files["steady"], files["regressed"], "--fail-if-slower", "5", "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["gate"]["regressed"] is True
    assert captured.err.startswith("graphprof: regression gate: FAIL")


def test_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys) -> None:
    for args, phrase in (
        ([files["base"], str(tmp_path / "missing.json")], "no such profile file"),
        ([files["base"], files["copy"], "--fail-if-slower", "fast"], "percentage"),
        ([files["base"], files["copy"], "--order-by", "bandwidth"], "not a diff column"),
        ([files["base"], files["copy"], "--format", "nope"], "--format"),
        ([files["base"], files["copy"], "--clock", "device"], "no device times"),
    ):
        assert main(["diff", *args]) == 2, args
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and phrase in captured.err, (args, captured.err)


def test_diff_command_runs_without_torch(files) -> None:
    code = ("import sys\nfrom graphprof.cli import main\n"
            f"rc = main(['diff', {files['base']!r}, {files['slower_mm']!r}])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "changed nodes" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "graphprof", "diff", files["base"], "missing.json"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
