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
"""

from __future__ import annotations

import copy
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
        g = torch.Generator().manual_seed(i)
        loss = run(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g))
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
