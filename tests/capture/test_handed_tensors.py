"""Tensors a step returns or keeps carry what eager's carried after every replay.

A step that calls ``retain_grad()`` on an activation (or its loss) and returns
or keeps it leaves the caller a ``.grad`` to read; replays handed back a new
tensor without one (None, and torch's non-leaf ``.grad`` warning). Now the
graph's value of that gradient is given to the tensor a replay hands out
(capture/handed_tensors.py). So are the attributes the step sets on such a
tensor (``out.n_tokens = n``), which replays' tensors lacked
(``AttributeError``) and the capture call's held graphprof's traced number;
one a replay could not give as eager's (a list) refuses the capture. And the
attributes it sets on its parameters, buffers and arguments, which replays
left at the capture call's (traced) number.
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


class TokenCount:
    """A step that hangs numbers on the tensors it returns and keeps: counted from its own counter, read
    from the loss (``.item()``), constants, text and a tuple, on a detached loss and on the loss itself
    (with its record), a detached tensor as an attribute too."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(8, 4)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.state: dict[str, Any] = {"i": 0}

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(x)
            loss = F.mse_loss(out, y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            reported = loss.detach()
            reported.n_tokens = x.shape[0] * (self.state["i"] + 1)
            reported.value = loss.item() * 2
            reported.tag = "train"
            reported._const = 123
            reported.span = (self.state["i"], 0.5, None)
            reported.logits = out.detach()
            loss.step_index = self.state["i"]
            self.state["last"] = reported
            self.state["i"] += 1
            return reported, loss
        self.step = step

    def seen(self, out: tuple[torch.Tensor, torch.Tensor]) -> list[Any]:
        return [list(out), [vars(t) for t in out], vars(self.state["last"]), self.state["i"],
                [(p.clone(), p.grad.clone()) for p in self.model.parameters()]]


@pytest.mark.parametrize("profiling", [True, False])
def test_attributes_of_returned_and_kept_tensors_are_eagers_after_every_replay(profiling: bool) -> None:
    eager, traced = TokenCount(), TokenCount()
    fn = graphprof.trace(traced.step, profiling=profiling)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning
        for i in range(CALLS):
            expected, got = eager.step(*_batch(i)), fn(*_batch(i))
            assert _same(traced.seen(got), eager.seen(expected)), f"call {i}"
            assert [type(v) for v in vars(got[0]).values()] == [type(v) for v in vars(expected[0]).values()]
            assert got[0] is traced.state["last"], f"call {i}"
            assert f"{got[0].n_tokens} {got[0].value:.6f}" == f"{expected[0].n_tokens} {expected[0].value:.6f}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1


def test_a_list_on_a_returned_tensor_refuses_the_capture_with_one_warning() -> None:
    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out = loss.detach()
            out.parts = [loss.item(), x.shape[0]]  # a list the caller may change: refused, not copied
            return out
        return model, step

    (eager_model, eager_step), (traced_model, traced_step) = make(), make()
    fn = graphprof.trace(traced_step, profiling=True)
    with pytest.warns(UserWarning, match="attribute 'parts' holds a list") as caught:
        for i in range(CALLS):
            expected, got = eager_step(*_batch(i)), fn(*_batch(i))
            assert torch.equal(got, expected) and got.parts == expected.parts, f"call {i}"
            assert [type(v) for v in got.parts] == [type(v) for v in expected.parts], f"call {i}"
            for a, b in zip(eager_model.parameters(), traced_model.parameters()):
                assert torch.equal(a, b) and torch.equal(a.grad, b.grad), f"call {i}"
    assert len([w for w in caught if "graphprof" in str(w.message)]) == 1
    assert fn.capture_mode != "whole-step"


class TaggedState:
    """A step that sets attributes on tensors from before the call: a number read from the loss and one
    counted on a parameter, a constant on a buffer, a counter on its argument."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 4)
        self.opt = torch.optim.SGD([*self.model.parameters(), *self.head.parameters()], lr=0.1)
        self.state: dict[str, Any] = {"i": 0}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(self.head(self.model(x)), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.head.weight.last_loss = loss.item()
            self.head.weight.updates = self.state["i"] + 1
            self.model.running_mean.source = "train"
            x.seen_at = self.state["i"]
            self.state["i"] += 1
            return loss.detach()
        self.step = step

    def seen(self, x: torch.Tensor) -> list[Any]:
        return [vars(self.head.weight), vars(self.model.running_mean), vars(x),
                [(p.clone(), p.grad.clone()) for p in self.opt.param_groups[0]["params"]]]


@pytest.mark.parametrize("profiling", [True, False])
def test_attributes_the_step_sets_on_its_parameters_and_arguments_are_eagers_after_every_replay(
        profiling: bool) -> None:
    eager, traced = TaggedState(), TaggedState()
    fn = graphprof.trace(traced.step, profiling=profiling)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning
        for i in range(CALLS):
            x, y = _batch(i)
            x_traced = x.clone()
            expected, got = eager.step(x, y), fn(x_traced, y)
            assert torch.equal(got, expected), f"call {i}"
            assert _same(traced.seen(x_traced), eager.seen(x)), f"call {i}"
            assert type(traced.head.weight.last_loss) is float, f"call {i}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1
