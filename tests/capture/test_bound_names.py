"""A clock the step reads under a name of its own reads anew on every replay, as eager reads it.

``from time import perf_counter``, ``from timeit import default_timer as
timer``, ``clock = time.time`` taken before the trace, a clock held in a
closure: the capture wrapped the clocks only as attributes of ``time``, so
these names reached the function itself, the graph kept the capture call's
reading, and every replay gave it again (a tokens/sec figure frozen), with
no warning. Each clock here is a fake that gives the next of known values on
every read, the same in the eager twin and the traced one.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import timeit
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from graphprof.runtime import workspace

CALLS = 6
_MEASURING = (os.path.dirname(torch.__file__), workspace.__file__)
#: The clock the step reads by a global name (``from time import perf_counter``); set by each test.
CLOCK: Callable[[], Any] = time.perf_counter


def _fake_clock(ns: bool) -> Callable[[], Any]:
    """The next of known readings on every read made for the step (its own, or a replay's reader). Reads
    for measurements get the real clock: torch's (``torch.compile`` times itself with ``time.time``) and
    the workspace run's (graphprof/runtime/workspace.py runs the new graph once more, clocks included)."""
    real = getattr(time, "time_ns" if ns else "time")
    reads = itertools.count(1)

    def read() -> Any:
        if sys._getframe(1).f_code.co_filename.startswith(_MEASURING):
            return real()
        n = reads.__next__()  # (not ``next``: the capture refuses the step's draws from an iterator it keeps)
        return n * 250_000_000 if ns else n * 0.25
    return read


def _run(spelling: str, name: str, traced: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, nn.Module]:
    fake = _fake_clock(name.endswith("_ns"))
    monkeypatch.setattr(time, name, fake)
    if name == "perf_counter":
        monkeypatch.setattr(timeit, "default_timer", fake)  # as in Python: the same function
    monkeypatch.setitem(globals(), "CLOCK", fake)
    held = fake  # a closure's cell

    def clock() -> Any:
        if spelling == "global":
            return CLOCK()
        if spelling == "closure":
            return held()
        if spelling == "timeit":
            return timeit.default_timer()
        return getattr(time, name)()  # ``time.perf_counter()`` written as such

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    readings: list[Any] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        t0 = clock()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        t1 = clock()
        readings.append((t0, t1, 8 / (t1 - t0)))  # a throughput, as a training loop logs it
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    returned = [fn(torch.full((3, 4), float(i))) for i in range(CALLS)]
    return returned, readings, model


@pytest.mark.parametrize(("spelling", "name"), [
    *((spelling, name) for spelling in ("global", "closure", "attribute")
      for name in ("perf_counter", "time", "monotonic_ns", "process_time", "time_ns")),
    ("timeit", "perf_counter"),  # ``timeit.default_timer`` is ``time.perf_counter``
])
def test_a_clock_read_under_any_name_reads_anew_on_every_replay(spelling: str, name: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    eager_returned, eager_readings, eager_model = _run(spelling, name, False, monkeypatch)
    returned, readings, model = _run(spelling, name, True, monkeypatch)
    assert readings == eager_readings
    assert all(torch.equal(a, b) for a, b in zip(returned, eager_returned, strict=True))
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(p, q)
