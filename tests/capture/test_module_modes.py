"""A step that sets its modules' mode itself: ``model.train()`` in the training step, ``model.eval()`` in
the evaluation step, with the other mode set between calls.

The graph depends on the flags the step found and on its own writes; the
replay check compares the flags at entry, and one effect at the graph's end
leaves the flags the step left. Comparing the flags after the capture call
instead made every call after an evaluation capture again (five times, then
segments), and a replay never set the flags.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof


def _model_and_steps() -> tuple[nn.Module, Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.BatchNorm1d(16), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(x: torch.Tensor) -> torch.Tensor:
        model.train()
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return model(x).square().mean()

    return model, train, evaluate


def _toggling() -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))

    def step(x: torch.Tensor) -> torch.Tensor:
        model.train(not model.training)
        return model(x).sum().detach()  # (a result to differentiate outside would refuse the graph)

    return model, step


def _evaluating_on_a_clock() -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    started = time.perf_counter()

    def step(x: torch.Tensor) -> torch.Tensor:
        out = model(x).sum()
        model.eval()
        if time.perf_counter() - started > 1e9:  # never, but a replay could not know
            out = out * 0
        return out

    return model, step


def _batch(i: int) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(i))


def _observed(model: nn.Module) -> list[Any]:
    return [[m.training for m in model.modules()], *(t.detach().clone() for t in model.state_dict().values())]


def _same(a: list[Any], b: list[Any]) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))


def test_a_training_step_that_calls_train_with_evaluation_between_calls_is_one_graph() -> None:
    runs = []
    for traced in (False, True):
        model, train, _ = _model_and_steps()
        step = graphprof.trace(train) if traced else train
        run = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no warning
            for i in range(8):
                torch.manual_seed(i)
                run.append((step(_batch(i)), _observed(model)))
                model.eval()  # the loop evaluates between training calls, eagerly
                with torch.no_grad():
                    run.append((model(_batch(100 + i)), _observed(model)))
        runs.append(run)
        if traced:
            assert step.capture_mode == "whole-step" and step.captures == 1
    for k, ((a, sa), (b, sb)) in enumerate(zip(*runs)):
        assert torch.equal(a, b) and _same(sa, sb), f"differs after call {k}"


def test_training_and_evaluation_steps_traced_side_by_side_replay_each_other_s_modes() -> None:
    runs = []
    for traced in (False, True):
        model, train, evaluate = _model_and_steps()
        if traced:
            train, evaluate = graphprof.trace(train), graphprof.trace(evaluate)
        run = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(8):
                torch.manual_seed(i)
                run.append((train(_batch(i)), _observed(model)))
                run.append((evaluate(_batch(100 + i)), _observed(model)))
        runs.append(run)
        if traced:
            assert train.capture_mode == evaluate.capture_mode == "whole-step"
            assert train.captures == evaluate.captures == 1
    for k, ((a, sa), (b, sb)) in enumerate(zip(*runs)):
        assert torch.equal(a, b) and _same(sa, sb), f"differs after call {k}"


def test_a_step_that_toggles_the_mode_it_found_replays_the_toggle() -> None:
    """``model.train(not model.training)``: the graph depends on the flags found, the flags left on them."""
    runs = []
    for traced in (False, True):
        model, step = _toggling()
        fn = graphprof.trace(step) if traced else step
        run = []
        for i in range(8):
            torch.manual_seed(i)
            run.append((fn(_batch(i)), _observed(model)))
        runs.append(run)
        if traced:
            assert fn.capture_mode == "whole-step" and fn.captures == 2  # one graph per mode found
    for k, ((a, sa), (b, sb)) in enumerate(zip(*runs)):
        assert torch.equal(a, b) and _same(sa, sb), f"differs after call {k}"


def test_a_refused_capture_puts_the_flags_back_before_the_step_runs_again() -> None:
    """The capture call ran ``model.eval()`` and was then refused (a branch on a clock): the step runs
    again as segments, and must find the training flags eager found, or its dropout would be off."""
    runs = []
    for traced in (False, True):
        model, step = _evaluating_on_a_clock()
        fn = graphprof.trace(step) if traced else step
        run = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's warning
            for i in range(4):
                model.train()
                torch.manual_seed(i)
                run.append((fn(_batch(i)), _observed(model)))
        runs.append(run)
        if traced:
            assert fn.capture_mode == "segments"
    for k, ((a, sa), (b, sb)) in enumerate(zip(*runs)):
        assert torch.equal(a, b) and _same(sa, sb), f"differs after call {k}"
