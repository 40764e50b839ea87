"""Python values a step decides on, changed between calls, are noticed: results stay eager's bitwise.

A tensor the step keeps in its own state (an EMA of the loss) is read where it
is kept on every replay, not frozen as the capture call's constant.

Each scenario builds the same loop twice from one seed, applies the same
change to both copies before some calls, and compares the eager copy with the
traced one after every call: losses, parameters and optimizer state.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.held_values import HeldValue, Hold, Place, compile_held_check, first_change

MODE = {"scale_loss": "no"}  # a global the step reads: its string decides a branch


class _Trainer:
    """A step that branches on its own flags, calls a swappable loss and reads a global config."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.zero_grad = True
        self.loss_fn: Callable[..., torch.Tensor] = F.mse_loss
        self.milestones = [1.0]
        self.logged: list[float] = []
        self.ema: torch.Tensor | None = None  # a tensor the step keeps and reads: read at run time

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.zero_grad:
            self.opt.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        if MODE["scale_loss"] == "yes":
            loss = loss * self.milestones[0]
        loss.backward()
        self.opt.step()
        self.logged.append(loss.item())
        d = loss.detach()
        self.ema = d if self.ema is None else 0.9 * self.ema + 0.1 * d
        return loss


Change = Callable[[int, _Trainer], None]


def _compare(change: Change, calls: int = 9) -> graphprof.tracing.TracedFunction:
    eager, traced_trainer = _Trainer(), _Trainer()
    traced = graphprof.trace(traced_trainer.step)
    try:
        for i in range(calls):
            change(i, eager)
            change(i, traced_trainer)
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
            torch.manual_seed(100 + i)
            expected = eager.step(x, y)
            torch.manual_seed(100 + i)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = traced(x, y)
            assert torch.equal(expected, got), f"loss differs after call {i}"
            for a, b in zip(eager.model.parameters(), traced_trainer.model.parameters()):
                assert torch.equal(a, b), f"parameters differ after call {i}"
                assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad))
            assert eager.logged == traced_trainer.logged
            assert eager.ema is not None and traced_trainer.ema is not None
            assert torch.equal(eager.ema, traced_trainer.ema), f"the kept tensor differs after call {i}"
    finally:
        MODE["scale_loss"] = "no"
    return traced


def _at(call: int, apply: Callable[[_Trainer], Any]) -> Change:
    return lambda i, t: apply(t) if i == call else None


SCENARIOS: dict[str, Change] = {
    "a flag switched off": _at(4, lambda t: setattr(t, "zero_grad", False)),
    "a flag switched off and on": lambda i, t: setattr(t, "zero_grad", i % 3 != 1),
    "a dropout schedule": lambda i, t: setattr(t.model[1], "p", 0.1 * (i // 3)),
    "the loss function swapped": _at(5, lambda t: setattr(t, "loss_fn", F.l1_loss)),
    "a global string": _at(4, lambda t: MODE.__setitem__("scale_loss", "yes")),
    "a read list's item": lambda i, t: (MODE.__setitem__("scale_loss", "yes"),
                                        t.milestones.__setitem__(0, 1.0 + (i >= 5))),
    "the logged list replaced": _at(5, lambda t: setattr(t, "logged", [])),
    "the kept tensor reset": _at(5, lambda t: setattr(t, "ema", None)),
    "a layer frozen after warm-up": lambda i, t: t.model[0].weight.requires_grad_(i < 4),
    "the kept tensor replaced by another shape": _at(5, lambda t: setattr(t, "ema", torch.zeros(1))),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_changed_value_gives_eagers_results(name: str) -> None:
    traced = _compare(SCENARIOS[name])
    assert traced.capture_mode == "whole-step"
    assert traced.captures >= 2  # the change captured the step again


def test_unchanged_values_replay_one_graph() -> None:
    traced = _compare(lambda i, t: None)
    assert traced.captures == 1 and traced.capture_mode == "whole-step"


def test_the_reason_names_the_value(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="graphprof"):
        _compare(_at(4, lambda t: setattr(t.model[1], "p", 0.5)), calls=6)
    assert any("p changed from 0.2 to 0.5" in r.getMessage() for r in caplog.records)


class _Holder:
    def __init__(self) -> None:
        self.flag = True
        self.rate = 0.5
        self.items = {"lr": 0.1, "name": "a"}


def _held(obj: _Holder) -> list[HeldValue]:
    return [
        HeldValue("h.flag", Place.ATTRIBUTE, obj, "flag", Hold.VALUE, True, lambda: obj.flag),
        HeldValue("h.rate", Place.ATTRIBUTE, obj, "rate", Hold.TYPE, float, lambda: obj.rate),
        HeldValue("h.items", Place.ATTRIBUTE, obj, "items", Hold.CONTENTS, obj.items, lambda: obj.items,
                  tuple(obj.items.items()), frozenset({"lr"})),
    ]


@pytest.mark.parametrize("change, reason", [
    (lambda h: None, None),
    (lambda h: setattr(h, "rate", 0.25), None),  # an input: its value is read at run time
    (lambda h: h.items.__setitem__("lr", 0.01), None),  # an input item likewise
    (lambda h: setattr(h, "flag", False), "h.flag changed from True to False"),
    (lambda h: setattr(h, "flag", 1), "h.flag changed from True to 1"),  # equal, not the same type
    (lambda h: setattr(h, "rate", 1), "h.rate changed from float to int"),
    (lambda h: h.items.__setitem__("name", "b"), "the items of h.items changed"),
    (lambda h: h.items.__setitem__("extra", 1), "the items of h.items changed"),
    (lambda h: setattr(h, "items", dict(h.items)), "h.items changed from a dict object to a dict object"),
    (lambda h: delattr(h, "flag"), "h.flag is gone"),
    (lambda h: setattr(h, "rate", math.nan), None),
])
def test_the_generated_check_agrees_with_first_change(change: Callable[[_Holder], Any], reason: str | None) -> None:
    holder = _Holder()
    held = _held(holder)
    check = compile_held_check(held)
    change(holder)
    assert first_change(held) == reason
    assert check() is (reason is None)


def test_a_tensor_read_from_a_kept_list_is_not_frozen_into_the_graph() -> None:
    """``self.hist[-1]`` names another item on each call: the step is profiled as segments, with a warning."""
    def make() -> Any:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hist = [torch.zeros(())]

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            hist.append(hist[-1] * 0.5 + loss.detach())
            return loss
        return step, hist

    (eager, eager_hist), (step, hist) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            x, y = torch.randn(3, 4), torch.randn(3, 1)
            assert torch.equal(eager(x, y), traced(x, y))
    assert [float(t) for t in eager_hist] == [float(t) for t in hist]
    # Refused as a list the step reads and extends, or, where that is not known, for the tensor kept in it.
    assert any("tensor kept in hist" in str(w.message) or "reads hist, a list it also appends to" in str(w.message)
               for w in caught)


def test_a_big_table_is_held_as_the_same_object_a_small_one_item_by_item() -> None:
    """Item by item costs time on every call: above CONTENTS_LIMIT items only the object is held."""
    from graphprof.capture.held_values import CONTENTS_LIMIT

    table = [1.0] * (CONTENTS_LIMIT + 1)
    small = [1.0]
    model = nn.Linear(2, 1)

    def step(x: torch.Tensor) -> torch.Tensor:
        return (model(x).sum() * table[0] * small[0]).detach()

    traced = graphprof.trace(step)
    for _ in range(3):
        traced(torch.ones(1, 2))
    holds = {h.describe: h.hold for h in traced.runner.captured.held}
    assert holds["table"] is Hold.VALUE and holds["small"] is Hold.CONTENTS
