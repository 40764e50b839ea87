"""A step that returns its own dataclass (``StepOutput(loss=..., logits=...)``) replays whole-step.

Research loops return their results in a dataclass of their own. Its fields
were one opaque leaf of the result, so such a step refused the capture and
ran as segments. A dataclass whose fields are all it holds is now opened as
a dict is, and every replay rebuilds one of the same class from its fields;
one with a ``__post_init__`` (which may compute another attribute, or act
when made) still refuses (``test_differentiable_outputs``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof

CALLS = 5


@dataclasses.dataclass(frozen=True)
class StepOutput:
    loss: torch.Tensor
    logits: torch.Tensor
    calls: int
    loss_value: float
    tags: list[Any]
    extra: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Inner:
    total: torch.Tensor


@dataclasses.dataclass
class Outer:
    inner: Inner
    note: str


def _make() -> Callable[[torch.Tensor], list[StepOutput]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"n": 0}

    def step(x: torch.Tensor) -> list[StepOutput]:
        opt.zero_grad()
        y = model(x)
        loss = y.pow(2).mean()
        loss.backward()
        opt.step()
        state["n"] += 1
        return [StepOutput(loss.detach(), y.detach(), state["n"], loss.item(), ["train", state["n"]],
                           {"sum": y.sum().detach()})]
    return step


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_a_returned_dataclass_replays_whole_step_with_eagers_fields_on_every_call() -> None:
    eager, traced = _make(), graphprof.trace(_make(), profiling=True)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            [expected], [got] = eager(x), traced(x)
            assert type(got) is StepOutput, f"call {i}"
            for f in dataclasses.fields(StepOutput):
                assert _same(getattr(expected, f.name), getattr(got, f.name)), f"{f.name} differs at call {i}"
            assert vars(got).keys() == vars(expected).keys()
            results.append(got)
    assert not [w for w in caught if "graphprof" in str(w.message)]
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    assert len({id(r) for r in results}) == CALLS, "each call returns an object of its own, as eager's"


def test_a_dataclass_inside_a_returned_dataclass_is_rebuilt_too() -> None:
    traced = graphprof.trace(lambda x: Outer(Inner(x * 2), "doubled"), profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning: whole-step
        for i in range(3):
            got = traced(torch.full((2,), float(i)))
            assert type(got) is Outer and type(got.inner) is Inner and got.note == "doubled"
            assert torch.equal(got.inner.total, torch.full((2,), 2.0 * i))
    assert traced.capture_mode == "whole-step" and traced.captures == 1
