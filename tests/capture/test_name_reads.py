"""A log only some calls append to: the other path is not captured again after every append.

``if n % k == 0: history.append(loss.item())`` gives two paths. The one that
does not append held the list with its items (it might have read them),
so each append broke that hold and the next call captured it again: one
capture per logging period, each costing about a hundred steps. A list in a
closure cell or a global that the path never loaded by name, and that
nothing else refers to, is now held as the same object only; a path that
reads it, by name, through another object, or dynamically, still holds
its items, and every call equals eager's.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

import graphprof

CALLS = 12


def _logging_step(read: Callable[[list[float], torch.Tensor], torch.Tensor] | None = None,
                  period: int = 3) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[float], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history: list[float] = []
    counter = {"n": 0}

    def step(x: torch.Tensor) -> torch.Tensor:
        counter["n"] += 1
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if read is not None and counter["n"] % period:
            loss = read(history, loss)  # the path that does not append reads the log
        loss.backward()
        opt.step()
        if counter["n"] % period == 0:
            history.append(loss.item())
        return loss.detach()
    return step, history, model


def _compare(read: Callable[[list[float], torch.Tensor], torch.Tensor] | None = None) -> Any:
    runs = []
    for traced in (False, True):
        step, history, model = _logging_step(read)
        fn = graphprof.trace(step) if traced else step
        losses = [fn(torch.full((3, 4), float(i % 5))) for i in range(CALLS)]
        runs.append((losses, list(history), [p.detach().clone() for p in model.parameters()], fn))
    (losses_a, history_a, params_a, _), (losses_b, history_b, params_b, fn) = runs
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert history_a == history_b
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    return fn


def test_the_path_that_does_not_log_is_captured_once() -> None:
    fn = _compare()
    assert fn.capture_mode == "whole-step"
    assert fn.captures == 2  # one graph per path; it was one capture per logging period


def test_a_path_that_reads_the_log_by_name_still_holds_its_items() -> None:
    def read(history: list[float], loss: torch.Tensor) -> torch.Tensor:
        return loss * 2 if len(history) > 1 else loss

    fn = _compare(read)
    assert fn.captures > 2  # the length it decided on changed: captured again, as before


_LOG: list[float] = []
_LEN_OF_LOG = functools.partial(len, _LOG)  # reads the log without naming it


def test_a_log_another_object_refers_to_still_holds_its_items() -> None:
    """The non-logging path reads the log's length through an object that refers to it."""
    def make() -> Callable[[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        counter = {"n": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            counter["n"] += 1
            out = model(x).sum()
            if counter["n"] % 3 == 0:
                _LOG.append(out.item())
            elif _LEN_OF_LOG() > 1:
                out = out * 2
            return out.detach()
        return step

    runs = []
    for traced in (False, True):
        _LOG.clear()
        step = make()
        fn = graphprof.trace(step) if traced else step
        runs.append([fn(torch.full((3, 4), float(i))) for i in range(CALLS)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


_DYNAMIC_LOG: list[float] = []


def test_a_path_that_reaches_the_log_dynamically_still_holds_its_items() -> None:
    """``globals()["..."]`` names no variable: every list keeps its items held."""
    def make() -> Callable[[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        counter = {"n": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            counter["n"] += 1
            out = model(x).sum()
            if counter["n"] % 3 == 0:
                _DYNAMIC_LOG.append(out.item())
            elif len(globals()["_DYNAMIC_LOG"]) > 1:
                out = out * 2
            return out.detach()
        return step

    runs = []
    for traced in (False, True):
        _DYNAMIC_LOG.clear()
        step = make()
        fn = graphprof.trace(step) if traced else step
        runs.append([fn(torch.full((3, 4), float(i))) for i in range(CALLS)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))



def test_an_attribute_named_like_a_builtin_is_not_a_dynamic_access() -> None:
    """``model.eval()`` loads the attribute ``eval``, not the builtin: the log still counts as unread."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], list[float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
        counter = {"n": 0}
        log: list[float] = []

        def step(x: torch.Tensor) -> torch.Tensor:
            counter["n"] += 1
            model.eval()
            out = model(x).sum()
            model.train()
            if counter["n"] % 3 == 0:
                log.append(out.item())
            return out.detach()
        return step, log

    runs = []
    for traced in (False, True):
        step, log = make()
        fn = graphprof.trace(step) if traced else step
        runs.append(([fn(torch.full((3, 4), float(i))) for i in range(CALLS)], list(log), fn))
    (out_a, log_a, _), (out_b, log_b, fn) = runs
    assert all(torch.equal(a, b) for a, b in zip(out_a, out_b)) and log_a == log_b
    assert fn.captures == 2
