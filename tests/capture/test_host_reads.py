"""Host reads timed in a segmented step's eager code (capture/host_reads.py)."""

from __future__ import annotations

import itertools
import threading
import warnings

import torch
from torch import nn

import graphprof
from graphprof.capture import host_reads
from graphprof.capture.host_reads import HOST_READS, HostRead, HostReadTimer


def _timer() -> tuple[HostReadTimer, list[HostRead]]:
    reads: list[HostRead] = []
    ticks = itertools.count(0, 10)
    return HostReadTimer(reads.append, lambda: next(ticks)), reads


def test_reads_are_timed_at_the_callers_line_and_results_unchanged() -> None:
    timer, reads = _timer()
    t = torch.tensor([1.5, 2.5])
    expected = (t.sum().item(), t.tolist(), float(t[0]), bool(t[1] > 2), t.numpy().tolist())
    try:
        with timer:
            got = (t.sum().item(), t.tolist(), float(t[0]), bool(t[1] > 2), t.numpy().tolist())
        t[0].item()  # after the step: not recorded
    finally:
        host_reads.uninstall()
    assert got == expected
    assert [r.method for r in reads] == ["item", "tolist", "__float__", "__bool__", "numpy"]
    assert all("test_host_reads.py" in r.source and r.end_ns > r.start_ns for r in reads)


def test_uninstall_leaves_torch_tensor_as_it_was() -> None:
    before = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}
    timer, _ = _timer()
    with timer:
        host_reads.uninstall()  # refused while a step is timed
        assert all(torch.Tensor.__dict__.get(name) is not before[name] for name in HOST_READS)
    assert host_reads.original(torch.Tensor.item) is torch._C.TensorBase.item
    host_reads.uninstall()
    assert {name: torch.Tensor.__dict__.get(name) for name in HOST_READS} == before


def test_paused_and_other_threads_are_not_recorded() -> None:
    timer, reads = _timer()
    t = torch.tensor(3.0)
    try:
        with timer:
            timer.paused = True
            t.item()
            timer.paused = False
            other = threading.Thread(target=t.item)
            other.start()
            other.join()
            t.item()
    finally:
        host_reads.uninstall()
    assert len(reads) == 1 and reads[0].method == "item"


def test_wrappers_stay_between_probed_steps_and_go_with_an_unprobed_one() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    logs: list[float] = []

    def step() -> torch.Tensor:
        loss = model(x).sum()
        logs.append(loss.item())
        return loss

    fn = graphprof.trace(step, capture="dynamo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            fn()
    assert "item" in torch.Tensor.__dict__  # probed steps: kept, so the type is not changed every step
    fn.profiling = False
    fn()
    assert "item" not in torch.Tensor.__dict__


def test_whole_step_capture_sees_through_the_wrappers() -> None:
    """A value read in a step captured while the wrappers are on is still guarded, as without them."""
    torch.manual_seed(0)
    w = torch.randn(4)

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if (x @ w) > 0 else x - 1

    timer, _ = _timer()
    host_reads.install()
    try:
        fn = graphprof.trace(step, capture="fx")
        xs = [torch.randn(4) for _ in range(6)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = [fn(x) for x in xs]
    finally:
        host_reads.uninstall()
    assert all(torch.equal(a, step(x)) for a, x in zip(got, xs))
