"""The graphprof command: demo, analyze, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphprof
from graphprof.cli import main
from tests.data.make_small_profile import build
from tests.profile.test_serialize import small_profile


def test_demo_profiles_a_real_resnet_step_and_saves_it(tmp_path, capsys) -> None:
    out = tmp_path / "demo.json"
    assert main(["demo", "--steps", "2", "--top", "5", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "resnet training step on CPU" in text and "roofline of the top 5 nodes" in text
    assert "critical path" in text and "findings" in text and "by module" in text
    assert "utilisation against peak" in text and "MFU (calibrated)" in text and "samples/s (16 samples per step)" in text
    assert "eager vs graph: eager step" in text  # measured on an eager twin beside each traced call
    profile = graphprof.load(out)
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~mask  # the mode of any new file, not mkstemp's 0600
    assert len(profile.steps) == 2 and profile.node_count > 100
    assert {"layer1.0.conv1", "fc"} <= {n.module for _, n in profile.iter_nodes()}
    assert profile.meta.peaks["flops_per_s"] > 0  # calibrated (or cached) peaks are recorded


def test_analyze_a_saved_profile(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    assert main(["analyze", str(path), "-t", "1"]) == 0
    text = capsys.readouterr().out
    assert "addmm" in text and "relu" not in text


def test_bad_input_is_one_line_and_exit_2(tmp_path) -> None:
    bad = tmp_path / "trace.json"
    bad.write_text('{"traceEvents": []}')
    for args in (["analyze", str(tmp_path / "missing.json")], ["analyze", str(bad)]):
        proc = subprocess.run([sys.executable, "-m", "graphprof", *args], capture_output=True, text=True)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("graphprof: error: ")
        assert "Traceback" not in proc.stderr


def test_demo_with_an_output_it_cannot_write_stops_before_profiling(tmp_path, capsys, monkeypatch) -> None:
    import graphprof.demo.run

    def profiling(**kwargs):
        raise AssertionError("the demo ran although its output cannot be written")

    monkeypatch.setattr(graphprof.demo.run, "run_demo", profiling)
    assert main(["demo", "--steps", "1", "-o", str(tmp_path / "missing" / "demo.json")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "does not exist" in captured.err


def test_export_mistakes_are_said_before_the_profile_is_read(tmp_path, capsys) -> None:
    """A bad output name, directory or size is one sentence before the (possibly long) load: here the
    profile does not even exist, and the command line's own mistake is what is reported."""
    missing = str(tmp_path / "missing.json")
    for output, extra, phrase in (("x.unknown", [], "cannot tell the format"), ("no/dir/t.html", [], "does not exist"),
                                  ("t.html", ["--max-size", "lots"], "--max-size takes a size")):
        assert main(["export", missing, "-o", str(tmp_path / output), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and phrase in err, (output, err)


def _bad_files(tmp_path) -> dict[str, tuple[object, str]]:
    """Each bad input of `graphprof analyze` and a phrase of its one-sentence error."""
    from graphprof.profile import Profile, StepRecord

    files = {
        "not_json.json": (b"not json at all", "is not JSON"),
        "truncated.json": (json.dumps(small_profile()).encode()[:-40], "truncated"),
        "chrome.json": (b'{"traceEvents": [{"name": "x", "ph": "X"}]}', "Chrome trace"),
        "future.json": (b'{"schema": "graphprof.profile/2"}', "unsupported profile schema version"),
        "no_steps.json": (Profile(graphs=small_profile().graphs), "has no profiled steps"),
        "no_nodes.json": (Profile(steps=(StepRecord(0, 1.0),)), "has no graph nodes"),
    }
    out = {}
    for name, (content, phrase) in files.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            content.save(str(path))
        out[str(path)] = (content, phrase)
    out[str(tmp_path / "missing.json")] = (None, "no such profile file")
    return out


def test_analyze_bad_files_exit_2_with_one_sentence(tmp_path, capsys) -> None:
    for path, (_, phrase) in _bad_files(tmp_path).items():
        assert main(["analyze", path]) == 2, path
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, path
        assert captured.err.startswith("graphprof: error: ") and phrase in captured.err, (path, captured.err)


def test_analyze_bad_option_values_exit_2_with_one_line(tmp_path) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    for args, phrase in (
        (["--name", "("], "not a valid regular expression"),
        (["--columns", "time,bogus"], "no column 'bogus'"),
        (["--order-by", "bogus"], "cannot order by 'bogus'"),
        (["--format", "xlsx"], "--format 'xlsx' is unknown"),
        (["--module-depth", "2"], "only applies with --aggregate-by module"),
        (["--stat", "p99"], "invalid choice: 'p99'"),
        (["--top", "many"], "invalid int value: 'many'"),
        (["--aggregate-by", "color"], "invalid choice: 'color'"),
    ):
        proc = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path), *args],
                              capture_output=True, text=True)
        assert proc.returncode == 2, args
        assert proc.stderr.count("\n") == 1 and phrase in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_analyze_filter_that_selects_nothing_exits_0_and_says_why(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    small_profile().save(str(path))
    assert main(["analyze", str(path), "--type", "conv2d"]) == 0
    assert "no rows: no node has type 'conv2d'" in capsys.readouterr().out
    assert main(["analyze", str(path), "--type", "conv2d", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["table"]["rows"] == []  # stdout stays valid JSON
    assert captured.err == "graphprof: note: no node has type 'conv2d'\n"


def test_analyze_reads_a_json_dumped_profile(tmp_path, capsys) -> None:
    path = tmp_path / "dumped.json"
    with open(path, "w") as f:
        json.dump(graphprof.Profile(meta=small_profile().meta, steps=small_profile().steps,
                                    graphs=small_profile().graphs), f)
    assert main(["analyze", str(path), "--aggregate-by", "type", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("rank,label,calls,time_s") and len(rows) == 3


def test_megengine_documented_command_runs(tmp_path: Path) -> None:
    """MegEngine's own example, with its spellings: memory, --opr-name, --print-only device."""
    path = tmp_path / "p.json"
    build().save(str(path))
    proc = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path), "-t", "5", "--order-by", "memory",
                           "--min-time", "1e-6", "--type", "MatrixMul", "--opr-name", "^mm", "--print-only", "device"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ordered by bytes_moved descending" in proc.stdout and "mm_" in proc.stdout


@pytest.mark.parametrize("columns", ["100", "60"])
def test_tables_fit_the_terminal_width(tmp_path: Path, columns: str) -> None:
    path = tmp_path / "p.json"
    build().save(str(path))
    env = {**os.environ, "COLUMNS": columns}
    for extra in ([], ["--aggregate-by", "module"], ["--format", "github"], ["--order-by", "bytes_read"]):
        proc = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path), "-t", "0", *extra],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert max(len(line) for line in proc.stdout.splitlines()) <= int(columns), extra


def test_tables_are_120_columns_when_not_a_terminal(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    build().save(str(path))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    narrow = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path), "-t", "0"],
                            capture_output=True, text=True, env=env).stdout
    wide = subprocess.run([sys.executable, "-m", "graphprof", "analyze", str(path), "-t", "0", "--wide"],
                          capture_output=True, text=True, env=env).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 120
    assert max(len(line) for line in wide.splitlines()) > 120  # every column: in shapes, memory, ...
    assert "out shapes" in wide and "out shapes" not in narrow
