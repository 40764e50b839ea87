"""``datetime.now()`` and ``date.today()`` in a step refuse the capture with one warning, naming the line.

They read the clock in C: the graph kept the capture call's datetime, and
every replay logged it again, with no warning. The step now runs another way,
where each call reads its own time, as eager does.
"""

from __future__ import annotations

import datetime
import warnings
from datetime import date
from datetime import datetime as Datetime
from typing import Any

import pytest
import torch
from torch import nn

import graphprof

CALLS = 6


def _run(spelling: str, traced: bool) -> tuple[list, list, nn.Module, list[str], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stamps: list[Any] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if spelling == "module":
            stamps.append(datetime.datetime.now().isoformat())
        elif spelling == "class":
            stamps.append(Datetime.now(datetime.timezone.utc))
        else:
            stamps.append(date.today())
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = [fn(torch.full((3, 4), float(i))) for i in range(CALLS)]
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    return returned, stamps, model, messages, fn


@pytest.mark.parametrize("spelling", ["module", "class", "date"])
def test_reading_the_time_with_datetime_refuses_the_capture_and_reads_it_on_every_call(spelling: str) -> None:
    eager_returned, eager_stamps, eager_model, _, _ = _run(spelling, False)
    returned, stamps, model, messages, fn = _run(spelling, True)
    assert len(messages) == 1 and "reads the time with" in messages[0]
    assert "test_clock_dates.py" in messages[0] and fn.captures == 0
    if spelling == "date":
        assert stamps == eager_stamps and all(type(s) is date for s in stamps)
    else:
        assert len(set(stamps)) == CALLS  # each call its own reading, as eager's
        assert [type(s) for s in stamps] == [type(s) for s in eager_stamps]
    assert all(torch.equal(a, b) for a, b in zip(returned, eager_returned, strict=True))
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_step_sees_datetimes_classes_as_they_are_while_it_is_captured() -> None:
    """Constructing, ``isinstance`` and the other attributes reach the real classes through the stand-ins."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    seen: list[Any] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        day = Datetime(2024, 5, 1) + datetime.timedelta(days=1)
        seen.append((type(day).__name__, isinstance(day, Datetime), day.isoformat(),
                     Datetime.fromisoformat("2024-05-03").day, date.min.isoformat()))
        return model(x).sum().detach()

    fn = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            fn(torch.full((3, 4), float(i)))
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert seen == [("datetime", True, "2024-05-02T00:00:00", 3, "0001-01-01")] * 4
    assert fn.captures == 1
