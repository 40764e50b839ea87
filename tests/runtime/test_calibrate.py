"""Calibration per CPU thread count: measured with --threads, looked up by the step's own count."""

from __future__ import annotations

import pytest
import torch

import graphprof
from graphprof.cli import main
from graphprof.runtime.calibrate import calibrate, device_key, find_calibration, load_cached

SMALL = {"matmul_n": 64, "copy_mib": 1, "repeats": 1}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_threads_are_measured_and_cached_apart_and_restored() -> None:
    before = torch.get_num_threads()
    one = calibrate("cpu", threads=1, **SMALL)
    assert torch.get_num_threads() == before
    assert "threads=1|" in device_key("cpu", 1)
    assert find_calibration("cpu", 1) == graphprof.runtime.calibrate.Calibration(one, 1)
    assert load_cached("cpu", 1) == one


def test_lookup_takes_the_nearest_cached_thread_count() -> None:
    calibrate("cpu", threads=1, **SMALL)
    calibrate("cpu", threads=3, **SMALL)
    assert find_calibration("cpu", 2).threads in (1, 3)
    assert find_calibration("cpu", 8).threads == 3
    assert find_calibration("cuda") is None


def test_a_profile_after_set_num_threads_has_peaks_and_says_which(monkeypatch) -> None:
    before = torch.get_num_threads()
    calibrate("cpu", threads=before + 1, **SMALL)
    fn = graphprof.trace(lambda x: (x * 2).sum(), profiling=True)
    for _ in range(3):
        fn(torch.ones(4))
    prof = fn.get_profile()
    assert prof.meta.peaks  # the report does not ask to run calibrate again
    assert f"--threads {before}" in prof.meta.peaks_note


def test_cli_threads_option_and_bad_values(capsys, monkeypatch) -> None:
    import graphprof.runtime.calibrate as cal

    monkeypatch.setattr(cal, "measure_peaks", lambda device, threads=None: {"flops_per_s": 1e9 * (threads or 1),
                                                                            "bytes_per_s": 2e9})
    assert main(["calibrate", "--threads", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "with 1 thread(s)" in out and "with 2 thread(s)" in out
    assert main(["calibrate", "--show", "--threads", "2"]) == 0
    assert "2.0 GFLOP/s" in capsys.readouterr().out
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-dir-for-graphprof")
    assert main(["calibrate", "--threads", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
