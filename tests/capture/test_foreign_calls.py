"""A number read from a tensor handed to another package (an experiment tracker): refused, not dropped.

``wandb.log({"loss": loss.item()})`` ran once, in the capture call, and never
again: a replay runs no Python, and the package's own state is not the step's
watched state. The package here is a stand-in installed under a
``site-packages`` folder, as every tracker is; the step is profiled as
segments with one warning naming the function, and it logs on every call.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from torch import nn

import graphprof

CALLS = 5


@pytest.fixture
def tracker(tmp_path: Path) -> Iterator[Any]:
    package = tmp_path / "site-packages" / "faketracker"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("RECORDS = []\n\n\ndef log(values, step=None):\n"
                                         "    RECORDS.append((dict(values), step))\n")
    sys.path.insert(0, str(tmp_path / "site-packages"))
    try:
        yield importlib.import_module("faketracker")
    finally:
        sys.path.remove(str(tmp_path / "site-packages"))
        sys.modules.pop("faketracker", None)


def _make(tracker: Any, what: Callable[[torch.Tensor, int], dict]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, i: int) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        tracker.log(what(loss, i), step=i)
        return loss.detach()

    return step


def _run(tracker: Any, what: Callable[[torch.Tensor, int], dict]) -> tuple[Any, list[str], list, list]:
    eager, traced = _make(tracker, what), graphprof.trace(_make(tracker, what))
    eager_records: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            tracker.RECORDS.clear()
            eager(x, i)
            eager_records += tracker.RECORDS
            tracker.RECORDS.clear()
            traced(x, i)
            assert tracker.RECORDS == eager_records[-1:], f"call {i} logged {tracker.RECORDS}"
    return traced, [str(w.message) for w in caught], eager_records, tracker.RECORDS


def test_a_value_read_from_a_tensor_handed_to_a_tracker_refuses_the_capture(tracker: Any) -> None:
    traced, messages, _, _ = _run(tracker, lambda loss, i: {"loss": loss.item()})
    assert traced.capture_mode == "segments"
    assert sum("hands a number read from a tensor to faketracker.log" in m for m in messages) == 1, messages
