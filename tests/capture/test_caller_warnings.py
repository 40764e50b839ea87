"""graphprof's fallback warnings blame the user's call of the traced function
(capture/caller_warnings.py), wherever in graphprof they are raised: the call
path, the fallback policy, or a torch.compile segment's check inside the step.
"""

from __future__ import annotations

import random
import sys
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof


def _graphprof_warnings(call: Callable[[int], Any], calls: int) -> list[tuple[str, int, str]]:
    """(filename, line, message) of each graphprof warning the calls raise."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            call(i)
    return [(w.filename, w.lineno, str(w.message)) for w in caught if "graphprof" in str(w.message)]


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_refused_capture_is_blamed_on_the_line_that_called_the_step() -> None:
    model, opt = _model()

    @graphprof.trace(profiling=False)
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).sum() * random.random()  # a Python draw: not one static graph
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    line = sys._getframe().f_lineno + 1
    seen = _graphprof_warnings(lambda i: step(torch.ones(2, 8)), 3)
    assert [(f, n) for f, n, _ in seen] == [(__file__, line)], seen
    assert "random" in seen[0][2]


def test_a_storm_of_captures_is_blamed_on_the_line_that_called_the_step() -> None:
    model, opt = _model()

    @graphprof.trace(profiling=False)
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    line = sys._getframe().f_lineno + 1
    seen = _graphprof_warnings(lambda i: step(torch.ones(i + 1, 8)), 8)  # a new shape on every call
    assert seen and all((f, n) == (__file__, line) for f, n, _ in seen), seen
    assert any("no longer capturing" in message for _, _, message in seen), seen


def test_a_warning_from_inside_a_segmented_step_is_blamed_on_the_line_that_called_it() -> None:
    model, opt = _model()

    @graphprof.trace(profiling=False, capture="dynamo")  # segments, asked for: recompiles are warned
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def call(i: int) -> None:
        step(torch.ones(2 if i < 2 else i + 1, 8))  # the blamed line; new batch sizes recompile

    line = call.__code__.co_firstlineno + 1
    seen = _graphprof_warnings(call, 5)
    assert len(seen) == 1 and "compiled" in seen[0][2] and "after the first call" in seen[0][2], seen
    assert all((f, n) == (__file__, line) for f, n, _ in seen), seen
