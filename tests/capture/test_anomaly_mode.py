"""A step under autograd's anomaly detection refuses the capture before its backward runs.

Anomaly mode checks every gradient for NaN on the host, which a static
graph cannot replay, so such a step runs as segments. The refusal used to
come from inside the capture's backward, where anomaly mode reported it as
an error of the user's forward ("Error detected in MseLossBackward0"): a
warning eager never gave. Now graphprof's one warning is the only one.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 4


def _make(inside: bool) -> tuple[Callable[..., torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        if inside:
            with torch.autograd.detect_anomaly():
                loss = F.mse_loss(model(x), y)
                loss.backward()
        else:
            loss = F.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        return loss.detach()
    return step, model


def _messages(run: Callable[[], Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("inside", [True, False], ids=["turned on in the step", "on for the whole run"])
def test_a_step_under_anomaly_detection_warns_once_and_trains_as_eager(inside: bool) -> None:
    (eager, eager_model), (step, model) = _make(inside), _make(inside)
    traced = graphprof.trace(step)
    batches = [(torch.randn(6, 4, generator=torch.Generator().manual_seed(i)), torch.randn(6, 1)) for i in range(CALLS)]
    previous = torch.is_anomaly_enabled()
    torch.autograd.set_detect_anomaly(not inside)
    try:
        eager_messages = _messages(lambda: [eager(x, y) for x, y in batches])
        messages = _messages(lambda: [traced(x, y) for x, y in batches])
    finally:
        torch.autograd.set_detect_anomaly(previous)
    assert all(map(torch.equal, eager_model.parameters(), model.parameters()))
    ours = [m for m in messages if "graphprof" in m]
    assert len(ours) == 1 and "anomaly detection" in ours[0], ours
    assert [m for m in messages if "graphprof" not in m] == eager_messages
    assert traced.capture_mode == "segments"
