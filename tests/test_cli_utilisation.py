"""``graphprof report``'s MFU/HFU options: a datasheet peak, tokens and samples per step, bad values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from graphprof.cli import main
from graphprof.profile.model import Phase, ProfileMeta
from tests.render.export_profiles import make_profile, node


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    nodes = [node(0, "mm", flops=4_000_000, bytes_read=1000, bytes_written=1000, times=(1e-3, 1e-3)),
             node(1, "mm", (0,), flops=8_000_000, phase=Phase.BACKWARD, times=(2e-3, 2e-3))]
    path = tmp_path / "p.json"
    make_profile(nodes, meta=ProfileMeta(function="step", peaks={"flops_per_s": 1e10, "bytes_per_s": 1e9}),
                 wall_time_s=4e-3).save(str(path))
    return path


def test_report_with_a_datasheet_peak_and_tokens(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(saved), "--peak-gflops", "40", "--tokens-per-step", "1000"]) == 0
    out = capsys.readouterr().out
    assert "utilisation against peak 10 GFLOP/s float32 (calibrated); 40 GFLOP/s (given)" in out
    # model FLOPs: 4 MFLOP forward x3 = 12 MFLOP in a 4 ms step = 3 GFLOP/s: 30% of 10, 7.5% of 40
    step_row = next(line for line in out.splitlines() if line.split()[:1] == ["step"] and "FLOP" in line)
    assert "12 MFLOP" in step_row and "30.0%" in step_row and "7.5%" in step_row
    assert "250 Ktokens/s (1000 tokens per step)" in out
    assert "peaks: 40 GFLOP/s (float32)" in out  # the roofline's compute roof too, bandwidth kept


@pytest.mark.parametrize("args, message", [
    (["--peak-gbs", "10"], "--peak-gbs needs --peak-gflops"),
    (["--peak-gflops", "-1"], "--peak-gflops must be positive"),
    (["--peak-gflops", "inf"], "--peak-gflops must be positive, not inf"),
    (["--peak-gflops", "40", "--peak-gbs", "nan"], "--peak-gbs must be positive, not nan"),
    (["--tokens-per-step", "0"], "--tokens-per-step must be positive, not 0"),
    (["--samples-per-step", "-8"], "--samples-per-step must be positive, not -8"),
])
def test_bad_values_are_one_line_and_exit_2(saved: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "graphprof", "report", str(saved), *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
