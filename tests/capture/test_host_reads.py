"""Host reads timed in a segmented step's eager code (capture/host_reads.py)."""

from __future__ import annotations

import itertools
import threading

import torch

from graphprof.capture.host_reads import HOST_READS, HostRead, HostReadTimer


def _timer() -> tuple[HostReadTimer, list[HostRead]]:
    reads: list[HostRead] = []
    ticks = itertools.count(0, 10)
    return HostReadTimer(reads.append, lambda: next(ticks)), reads


def test_reads_are_timed_at_the_callers_line_and_results_unchanged() -> None:
    timer, reads = _timer()
    t = torch.tensor([1.5, 2.5])
    expected = (t.sum().item(), t.tolist(), float(t[0]), bool(t[1] > 2), t.numpy().tolist())
    timer.install()
    try:
        got = (t.sum().item(), t.tolist(), float(t[0]), bool(t[1] > 2), t.numpy().tolist())
    finally:
        timer.uninstall()
    assert got == expected
    assert [r.method for r in reads] == ["item", "tolist", "__float__", "__bool__", "numpy"]
    assert all("test_host_reads.py" in r.source and r.end_ns > r.start_ns for r in reads)


def test_uninstall_leaves_torch_tensor_as_it_was() -> None:
    before = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}
    timer, _ = _timer()
    timer.install()
    assert all(torch.Tensor.__dict__.get(name) is not None for name in HOST_READS)
    timer.uninstall()
    assert {name: torch.Tensor.__dict__.get(name) for name in HOST_READS} == before


def test_paused_and_other_threads_are_not_recorded() -> None:
    timer, reads = _timer()
    t = torch.tensor(3.0)
    timer.install()
    try:
        timer.paused = True
        t.item()
        timer.paused = False
        other = threading.Thread(target=t.item)
        other.start()
        other.join()
        t.item()
    finally:
        timer.uninstall()
    assert len(reads) == 1 and reads[0].method == "item"
