"""The graphprof command: demo, analyze, and one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import graphprof
from graphprof.cli import main
from tests.profile.test_serialize import small_profile


def test_demo_profiles_a_real_resnet_step_and_saves_it(tmp_path, capsys) -> None:
    out = tmp_path / "demo.json"
    assert main(["demo", "--steps", "2", "--top", "0", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "resnet training step on CPU" in text and "convolution" in text and "layer1.0.conv1" in text
    profile = graphprof.load(out)
    assert len(profile.steps) == 2 and profile.node_count > 100


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
