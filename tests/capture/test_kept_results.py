"""A step that returns an object it keeps returns that very object on every replay, as eager does.

``self.history.append(out); return out``, ``self.last = stats; return stats``
and ``return self.metrics`` give eager's caller the kept object: ``ret is
trainer.last``, and a change to the returned dict is a change to the kept
one. A replay returned a copy rebuilt from its outputs, and for a kept dict
the step updates, the capture call's numbers on every call. One object kept
in two places (``self.last`` and ``self.history[-1]``) was two objects after a
replay (capture/kept_results.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import graphprof

CALLS = 5


class Trainer:
    """Returns what it keeps, every way ``mode`` says."""

    def __init__(self, mode: str) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.mode = mode
        self.history: list[dict[str, Any]] = []
        self.last: Any = None
        self.metrics: dict[str, Any] = {"loss": 0.0, "n": 0}

    def step(self, x: torch.Tensor) -> Any:
        self.opt.zero_grad()
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        if self.mode == "appended":
            out = {"loss": loss.item(), "value": loss.detach()}
            self.history.append(out)
            return out
        if self.mode == "assigned":
            stats = {"loss": loss.item(), "steps": [loss.item()]}
            self.last = stats
            return loss.item(), stats
        if self.mode == "updated":
            self.metrics["loss"] = loss.item()
            self.metrics["n"] += 1
            return self.metrics
        stats = {"loss": loss.item()}  # "twice": one object in two places, and a tuple kept
        self.last = stats
        self.history.append(stats)
        return stats, self.metrics

    def seen(self, result: Any) -> list[Any]:
        """The kept values, and which of them the result is."""
        last = self.history[-1] if self.history else None
        return [repr(self.history), repr(self.last), repr(self.metrics), repr(result),
                result is last, result is self.last, result is self.metrics, self.last is last,
                isinstance(result, tuple) and [r is self.last or r is self.metrics for r in result]]


def _x(i: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(i))


def _check(mode: str) -> None:
    eager, traced = Trainer(mode), Trainer(mode)
    fn = graphprof.trace(traced.step, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning: whole-step
        for i in range(CALLS):
            expected, got = eager.step(_x(i)), fn(_x(i))
            assert traced.seen(got) == eager.seen(expected), f"call {i}"
            # The caller changes what it was returned: eager changes the kept object with it.
            for result in (expected, got):
                returned = result[-1] if isinstance(result, tuple) else result
                returned["seen_by_caller"] = i
            assert traced.seen(got) == eager.seen(expected), f"call {i}, after the caller's change"
            for a, b in zip(eager.model.parameters(), traced.model.parameters()):
                assert torch.equal(a, b), f"call {i}"
    assert fn.capture_mode == "whole-step"


def test_a_returned_item_the_step_appends_is_the_kept_one() -> None:
    _check("appended")


def test_a_returned_dict_the_step_assigns_is_the_kept_one() -> None:
    _check("assigned")


def test_a_returned_dict_the_step_updates_is_the_kept_one_with_each_calls_numbers() -> None:
    _check("updated")


def test_one_object_kept_in_two_places_and_returned_stays_one_object() -> None:
    _check("twice")
