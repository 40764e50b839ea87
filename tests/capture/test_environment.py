"""Environment variables the step reads are held between calls; ones it sets refuse the capture.

``float(os.environ.get("LOSS_SCALE", "1"))`` or ``if os.getenv("CLIP"):``
in a step was decided in the capture call and kept by every replay after
the variable changed, silently.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6
SCALE, CLIP = "GRAPHPROF_TEST_LOSS_SCALE", "GRAPHPROF_TEST_CLIP"


def _make(body: Callable[[torch.Tensor, nn.Module], torch.Tensor]) -> tuple[Callable[..., Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = body(F.mse_loss(model(x), y), model)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, model


def _read_three_ways(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
    loss = loss * float(os.environ.get(SCALE, "1.0"))
    if os.getenv(CLIP):
        loss = loss.clamp(max=float(os.environ[CLIP]))
    if SCALE in os.environ:
        loss = loss + 1
    return loss


def _changes(i: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Call 2 sets the scale, call 3 sets a clip, call 4 removes the scale."""
    if i == 2:
        monkeypatch.setenv(SCALE, "2.5")
    if i == 3:
        monkeypatch.setenv(CLIP, "0.01")
    if i == 4:
        monkeypatch.delenv(SCALE)


def test_environment_variables_the_step_reads_are_read_as_eager_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCALE, raising=False)
    monkeypatch.delenv(CLIP, raising=False)
    (eager, eager_model), (step, model) = _make(_read_three_ways), _make(_read_three_ways)
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(CALLS):
            _changes(i, monkeypatch)
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"loss of call {i}"
            assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 4  # one graph for each set of values the step decided on


def test_a_step_that_sets_an_environment_variable_refuses_with_eagers_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay would not set it again: the step runs as segments, which run its Python."""
    monkeypatch.delenv(SCALE, raising=False)

    def body(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        os.environ[SCALE] = str(int(os.environ.get(SCALE, "0")) + 1)
        return loss

    step, _ = _make(body)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            traced(torch.randn(5, 4), torch.randn(5, 1))
            assert os.environ[SCALE] == str(i + 1)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "sets an environment variable" in messages[0], messages
    assert traced.capture_mode == "segments"
    monkeypatch.delenv(SCALE)


def test_a_step_that_calls_putenv_refuses() -> None:
    """``os.putenv`` changes the process's environment (what a child process inherits), which a replay
    would not change again."""
    step, _ = _make(lambda loss, model: (os.putenv(SCALE, "2"), loss)[1])
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            traced(torch.randn(5, 4), torch.randn(5, 1))
    os.unsetenv(SCALE)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "os.putenv" in messages[0], messages
    assert traced.capture_mode == "segments"


def test_a_step_that_lists_the_environment_sees_a_variable_set_since() -> None:
    """``os.environ.copy()`` (or ``dict(os.environ)``, a loop over it) lists every name; only the values of
    the names read were held, so a variable set after the capture was never seen."""
    def body(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        settings = os.environ.copy()
        return loss * float(settings.get(SCALE, "1.0"))

    os.environ.pop(SCALE, None)
    (eager, eager_model), (step, model) = _make(body), _make(body)
    traced = graphprof.trace(step)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(CALLS):
                if i == 3:
                    os.environ[SCALE] = "2.5"
                g = torch.Generator().manual_seed(i)
                x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
                assert torch.equal(eager(x, y), traced(x, y)), f"loss of call {i}"
    finally:
        os.environ.pop(SCALE, None)
    assert all(map(torch.equal, eager_model.parameters(), model.parameters()))
    assert traced.capture_mode == "whole-step" and traced.captures == 2
