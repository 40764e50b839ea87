"""The bottleneck report fits the terminal like ``analyze``'s table: columns drop and clip, prose wraps."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from graphprof.analysis.report import build_report
from graphprof.analysis.roofline import Peaks
from graphprof.profile.model import Profile
from graphprof.render.fit import resolve_width
from graphprof.render.report_text import render_report


def _longest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("calibrated", [False, True], ids=["no peaks", "calibrated peaks"])
@pytest.mark.parametrize("width", [120, 90, 60])
def test_every_line_of_the_report_fits_the_width(real: Profile, width: int, calibrated: bool) -> None:
    if calibrated:  # as a profile taken after `graphprof calibrate` records them
        real = dataclasses.replace(real, meta=dataclasses.replace(real.meta, peaks={"flops_per_s": 5e10, "bytes_per_s": 1e10}))
    text = render_report(build_report(real), width)
    assert _longest(text) <= width
    if calibrated:  # the MFU lines are there to fit too, the per-step range the longest of them
        assert "MFU (calibrated) per profiled step" in text
    assert "roofline of the top" in text and "bound" in text  # the verdict column always stays


def test_wide_keeps_every_column_and_whole_names(real: Profile) -> None:
    report = build_report(real)
    wide, narrow = render_report(report, None), render_report(report, 60)
    assert _longest(wide) > 60
    roofline = wide.split("roofline of the top", 1)[1].split("\n\n", 1)[0]
    header = roofline.splitlines()[1]
    for column in ("module", "source", "FLOPs", "FLOP/B", "achieved", "of roofline"):
        assert column in header
    longest_source = max((r.node.source for r in report.roofline_rows), key=len)
    assert longest_source in wide and longest_source not in narrow.split("critical path", 1)[0].split("roofline", 1)[1]


def test_the_report_says_when_peaks_came_from_another_thread_count(real: Profile) -> None:
    note = "peaks measured with 3 threads, the step ran with 2 (run `graphprof calibrate --threads 2`)"
    meta = dataclasses.replace(real.meta, peaks_note=note)
    text = render_report(build_report(dataclasses.replace(real, meta=meta), Peaks(5e10, 1e10)), None)
    assert f"note: {note}" in text


def test_width_below_the_least_table_is_one_sentence() -> None:
    with pytest.raises(ValueError, match="--width must be a whole number >= 40"):
        resolve_width(10, wide=False)
    assert resolve_width(10, wide=True) is None and resolve_width(77, wide=False) == 77


def test_cli_report_fits_width_and_refuses_a_tiny_one(real: Profile, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    real.save(str(path))
    done = subprocess.run([sys.executable, "-m", "graphprof", "report", str(path), "--width", "70"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _longest(done.stdout) <= 70
    bad = subprocess.run([sys.executable, "-m", "graphprof", "report", str(path), "--width", "5"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--width" in bad.stderr
