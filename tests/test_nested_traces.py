"""A traced function called from inside another traced function's call.

A forward traced on its own (``graphprof.trace(model_forward)``) and a train
step traced around it: the inner call first tried a capture of its own inside
the outer's capture, ran as segments, and so refused the outer's whole-step
capture; the outer then compiled as segments, and dynamo's lazily compiled
backward called graphprof's compile callback with its lock held: the step
hung. With the outer forced to segments, dynamo traced into graphprof's own
machinery and crashed. An inner call now runs as the plain function: its ops
belong to the outer call's graph.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


def _pair(traced: bool, inner_alone_first: bool, capture: str) -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Dropout(0.2), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    inner = graphprof.trace(forward, profiling=True) if traced else forward

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(inner(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    if inner_alone_first:
        g = torch.Generator().manual_seed(99)
        with torch.no_grad():
            inner(torch.randn(8, 6, generator=g))
    return model, graphprof.trace(step, profiling=True, capture=capture) if traced else step, inner


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def _within(seconds: float, run: Any) -> Any:
    """``run()`` on a daemon thread; fails instead of hanging the suite when it does not return."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(run()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the calls did not return within {seconds} s"
    assert result, "the calls raised (see the thread's traceback above)"
    return result[0]


@pytest.mark.parametrize(("inner_alone_first", "capture"), [(False, "auto"), (True, "auto"), (False, "dynamo")],
                         ids=["nested only", "inner called alone first", "outer as segments"])
def test_a_traced_function_inside_another_runs_plainly_and_the_step_equals_eager(
        inner_alone_first: bool, capture: str) -> None:
    model_a, step_a, _ = _pair(False, inner_alone_first, capture)
    model_b, step_b, inner = _pair(True, inner_alone_first, capture)

    def calls() -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(5):
                torch.manual_seed(i)
                a = step_a(*_batch(i))
                torch.manual_seed(i)
                b = step_b(*_batch(i))
                assert_modules_equal(model_a, model_b, f"after call {i}")
                pairs.append((a, b))
        return pairs

    for a, b in _within(120, calls):
        assert torch.equal(a, b)
    assert step_b.capture_mode == ("segments" if capture == "dynamo" else "whole-step")
    assert step_b.get_profile().steps
    # The inner function profiled only the call it made alone, never one inside the step.
    assert inner._calls == (1 if inner_alone_first else 0)
