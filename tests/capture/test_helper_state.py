"""State kept by a helper function the step calls: its globals, its closure, under a decorator.

Only the step's own closure and globals (and one function in its closure)
were watched. A helper the step calls by a global name, or one decorated
with ``@torch.no_grad()`` (a torch wrapper function in the step's closure),
kept its counter and its log where no capture looked: the counter stayed at
the capture call's value in every replay, an EMA weight computed from it was
a constant of the graph, and a log appended by the helper held graphprof's
own ``TracedScalar``. All silently. The functions of the user's code that the
step's code names (and those they name, through a library's decorator) are
now walked like the step.

So are the methods of the user's classes whose objects the walk reaches, once
walked code names them (``tracker.update(v)``) or torch calls them (a
module's ``forward``): a forward reading a global scale or flag baked the
capture call's value. And what a callable the step holds binds: a bound
method's object, a ``functools.partial``'s arguments.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6
COUNTS = {"n": 0}
LOSSES: list[float] = []


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def _decay_weight() -> float:
    """A global helper that advances a global counter and returns the EMA weight it gives."""
    COUNTS["n"] += 1
    return 1 - 0.9 ** COUNTS["n"]


def _log(value: float) -> None:
    LOSSES.append(value)


@torch.no_grad()
def _ema_update(ema: nn.Module, model: nn.Module) -> None:
    COUNTS["n"] += 1
    weight = 1 - 0.9 ** COUNTS["n"]
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p, weight)


def _run(traced: bool, helper: str) -> tuple[list[Any], Any]:
    COUNTS["n"] = 0
    LOSSES.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    local = {"n": 0}

    @torch.no_grad()
    def ema_update() -> None:  # in the step's closure, as a torch wrapper function
        local["n"] += 1
        weight = 1 - 0.9 ** local["n"]
        for e, p in zip(ema.parameters(), model.parameters()):
            e.lerp_(p, weight)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if helper == "a global helper":
            weight = _decay_weight()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.lerp_(p, weight)
        elif helper == "a global log":
            _log(loss.item())
        elif helper == "a decorated global helper":
            _ema_update(ema, model)
        else:
            ema_update()
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    observed = []
    for i in range(CALLS):
        loss = run(*_batch(i))
        observed.append((loss, [p.detach().clone() for p in ema.parameters()], dict(COUNTS), dict(local),
                         list(LOSSES)))
    return observed, run


@pytest.mark.parametrize("helper", ["a global helper", "a global log", "a decorated global helper",
                                    "a decorated closure"])
def test_state_a_helper_keeps_changes_on_every_replay_as_in_eager(helper: str) -> None:
    eager, _ = _run(False, helper)  # one after the other: the globals are shared
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal
        traced, run = _run(True, helper)
    for i, (a, b) in enumerate(zip(eager, traced)):
        assert torch.equal(a[0], b[0]), f"loss of call {i}"
        assert all(torch.equal(p, q) for p, q in zip(a[1], b[1])), f"EMA after call {i}"
        assert a[2:] == b[2:], f"counters or log after call {i}: {a[2:]} vs {b[2:]}"
        assert all(type(v) is float for v in b[4]), f"the log holds {b[4]}"
    assert run.capture_mode == "whole-step" and run.captures == 1


SCALE = 1.0
USE_BIAS = False
HISTORY: list[int] = []


class _Net(nn.Module):
    """A model of the user's code whose forward reads two module globals."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x) * SCALE
        return out + 1 if USE_BIAS else out


def _forward_globals_run(traced: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    global SCALE, USE_BIAS
    SCALE, USE_BIAS = 1.0, False
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    losses = []
    for i in range(CALLS):
        SCALE = 2.0 if i >= 3 else 1.0
        USE_BIAS = i >= 4
        losses.append(run(*_batch(i)))
    return losses, [p.detach().clone() for p in model.parameters()], run


def test_globals_a_models_forward_reads_are_read_on_every_call() -> None:
    """A forward's global scale and flag, changed between calls, were constants of the graph."""
    eager, params_a, _ = _forward_globals_run(False)
    losses, params_b, run = _forward_globals_run(True)
    assert all(torch.equal(a, b) for a, b in zip(eager, losses))
    assert all(torch.equal(p, q) for p, q in zip(params_a, params_b))
    assert run.capture_mode == "whole-step"


class _Tracker:
    def __init__(self) -> None:
        self.n = 0
        self.losses: list[float] = []

    def update(self, value: float) -> None:
        self.n += 1
        self.losses.append(value)
        HISTORY.append(self.n)  # a global the step's code never names


def _append_to(log: list[float], value: float) -> None:
    log.append(value)


def _callable_run(traced: bool, how: str) -> tuple[Any, ...]:
    HISTORY.clear()
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    tracker, log = _Tracker(), []  # type: ignore[var-annotated]
    update, append = tracker.update, functools.partial(_append_to, log)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if how == "a method":
            tracker.update(loss.item())
        elif how == "a bound method":
            update(loss.item())
        else:
            append(loss.item())
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal
        for i in range(CALLS):
            run(*_batch(i))
    return tracker.n, list(tracker.losses), list(HISTORY), list(log), run


@pytest.mark.parametrize("how", ["a method", "a bound method", "a partial"])
def test_what_a_callable_the_step_holds_binds_changes_on_every_replay(how: str) -> None:
    """``tracker.update(v)`` writing a global, ``update = tracker.update``, ``partial(append_to, log)``:
    the global, the bound object and the bound list were reached by no name the step has."""
    *eager, _ = _callable_run(False, how)  # one after the other: HISTORY is shared
    *traced, run = _callable_run(True, how)
    assert eager == traced
    assert all(type(v) in (int, float) for values in traced[1:] for v in values)
    assert run.capture_mode == "whole-step" and run.captures == 1
