"""Tensors a step returns or keeps carry what eager's carried after every replay.

A step that calls ``retain_grad()`` on an activation (or its loss) and returns
or keeps it leaves the caller a ``.grad`` to read; replays handed back a new
tensor without one (None, and torch's non-leaf ``.grad`` warning). Now the
graph's value of that gradient is given to the tensor a replay hands out
(capture/handed_tensors.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def _grad_of(tensor: torch.Tensor) -> Any:
    """What the caller reads of a tensor's retained gradient (``.grad`` only where it is retained: a
    non-leaf's otherwise warns)."""
    return (tensor.retains_grad, tensor.is_leaf, tensor.requires_grad,
            None if not tensor.retains_grad or tensor.grad is None else tensor.grad.clone())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


class Saliency:
    """A step that retains the gradient of its activation and of its loss, keeps the activation and
    returns both, the activation's gradient too; ``late``: it asks for it after its backward."""

    def __init__(self, late: bool = False) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.kept: dict[str, torch.Tensor] = {}

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[Any, ...]:
            h = self.model[0](x)
            if not late:
                h.retain_grad()
            loss = F.mse_loss(self.model[2](self.model[1](h)), y)
            loss.retain_grad()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if late:
                h.retain_grad()  # after the backward: eager's .grad stays None
            self.kept["act"] = h
            return loss, h, h.grad
        self.step = step

    def seen(self, out: tuple[Any, ...]) -> list[Any]:
        loss, h, h_grad = out
        return [_grad_of(loss), _grad_of(h), h_grad, _grad_of(self.kept["act"]),
                [(p.clone(), p.grad.clone()) for p in self.model.parameters()],
                [s["momentum_buffer"].clone() for s in self.opt.state.values()]]


@pytest.mark.parametrize("profiling", [True, False])
@pytest.mark.parametrize("late", [False, True])
def test_retained_gradients_of_returned_and_kept_tensors_are_eagers_after_every_replay(
        profiling: bool, late: bool) -> None:
    eager, traced = Saliency(late), Saliency(late)
    fn = graphprof.trace(traced.step, profiling=profiling)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning, and no non-leaf .grad warning
        for i in range(CALLS):
            expected, got = eager.step(*_batch(i)), fn(*_batch(i))
            assert _same(traced.seen(got), eager.seen(expected)), f"call {i}"
            assert (got[1] is traced.kept["act"]) and (got[2] is got[1].grad), f"call {i}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1


def test_a_backward_after_the_step_adds_to_the_retained_gradient_before_it_raises_as_eagers() -> None:
    eager, traced = Saliency(), Saliency()
    fn = graphprof.trace(traced.step, profiling=True)
    for i in range(CALLS):
        expected, got = eager.step(*_batch(i)), fn(*_batch(i))
        errors = []
        for out in (expected, got):
            try:
                (out[1] * 2).sum().backward()  # through the graph the step's backward freed
            except RuntimeError as exc:
                errors.append(str(exc))
        assert len(errors) == 2 and errors[0] == errors[1], f"call {i}"
        assert _same(traced.seen(got), eager.seen(expected)), f"call {i}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1
