"""Tensors a step keeps or returns have eager's autograd flags after every replay.

Eager leaves a loss or logits the step's backward used with ``requires_grad``
True, ``is_leaf`` False and a ``grad_fn``; a replay, which runs without
autograd's record, handed back leaves without one (``self.last_logits``, a
list of losses appended undetached, a dict entry, a module attribute, the
returned tensors). Now each gets a node named as eager's, whose backward
raises eager's error, and one the step's backward left usable refuses the
capture (capture/kept_history.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 5


def _flags(value: Any, text: bool = True) -> Any:
    """What code after the step can see of a tensor's autograd record, its values, and (``text``) its
    text: as segments, its ``grad_fn`` is torch.compile's own (``CompiledFunctionBackward``)."""
    if isinstance(value, torch.Tensor):
        return (value.requires_grad, value.is_leaf, value.grad_fn is None, value.tolist(),
                repr(value) if text else None)
    if isinstance(value, (list, tuple)):
        return [_flags(v, text) for v in value]
    if isinstance(value, dict):
        return {k: _flags(v, text) for k, v in value.items()}
    return value


class Trainer:
    """A step keeping tensors every way a loop does: on itself, in a list and a dict it keeps, on its
    module, in a closure's list and dict, detached and not, with ``.item()`` logged."""

    def __init__(self, retain: bool = False) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 3)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.retain = retain
        self.losses: list[torch.Tensor] = []
        self.logged: list[float] = []
        self.store: dict[str, torch.Tensor] = {}
        self.last_logits: torch.Tensor | None = None
        self.last_detached: torch.Tensor | None = None
        closure_log: list[torch.Tensor] = []
        closure_cache: dict[str, torch.Tensor] = {}
        self.closure = (closure_log, closure_cache)

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self.opt.zero_grad()
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward(retain_graph=self.retain)
            self.opt.step()
            probs = logits.softmax(-1)  # off the loss's path, from a node its backward freed
            self.last_logits = logits
            self.last_detached = logits.detach()
            self.losses.append(loss)
            self.logged.append(loss.item())
            self.store["loss"] = loss
            self.model.act = probs
            closure_log.append(loss)
            closure_cache["logits"] = logits
            return loss, logits, loss.detach()
        self.step = step

    def seen(self, text: bool = True) -> dict[str, Any]:
        return {"last_logits": _flags(self.last_logits, text), "last_detached": _flags(self.last_detached, text),
                "losses": _flags(self.losses, text), "logged": list(self.logged), "store": _flags(self.store, text),
                "act": _flags(self.model.act, text), "closure": _flags(self.closure, text)}


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def _backward_error(tensor: torch.Tensor) -> str:
    try:
        tensor.sum().backward()
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_kept_and_returned_tensors_have_eagers_autograd_flags_after_every_replay() -> None:
    eager, traced = Trainer(), Trainer()
    fn = graphprof.trace(traced.step, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning: whole-step
        for i in range(CALLS):
            expected, got = eager.step(*_batch(i)), fn(*_batch(i))
            assert _flags(got) == _flags(expected), f"call {i}"
            assert traced.seen() == eager.seen(), f"call {i}"
            assert (got[1] is traced.last_logits) == (expected[1] is eager.last_logits) is True
            assert (traced.closure[1]["logits"] is traced.last_logits) is True
            assert (traced.losses[-1] is traced.store["loss"] is got[0]) is True
            for a, b in zip(eager.model.parameters(), traced.model.parameters()):
                assert torch.equal(a, b) and torch.equal(a.grad, b.grad), f"call {i}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1
    # A backward outside the step through what it kept: eager's error, in eager's words.
    assert _backward_error(traced.last_logits) == _backward_error(eager.last_logits) != ""
    assert _backward_error(got[0]) == _backward_error(expected[0]) != ""


def test_a_kept_tensor_whose_graph_the_backward_retained_refuses_the_capture() -> None:
    eager, traced = Trainer(retain=True), Trainer(retain=True)
    fn = graphprof.trace(traced.step, profiling=True)
    with pytest.warns(UserWarning, match="retain_graph=True"):
        for i in range(CALLS):
            expected, got = eager.step(*_batch(i)), fn(*_batch(i))
            assert _flags(got, text=False) == _flags(expected, text=False), f"call {i}"
            assert traced.seen(text=False) == eager.seen(text=False), f"call {i}"
    assert fn.capture_mode != "whole-step"
    # Eager's retained graph still differentiates; so does what the segments kept.
    assert _backward_error(traced.last_logits) == _backward_error(eager.last_logits) == ""


def _leaf_step(make_leaf: bool) -> tuple[Any, dict[str, Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: dict[str, Any] = {}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        if make_leaf:  # a leaf of its own: eager's backward gives it a .grad
            leaf = torch.zeros(5, 1, requires_grad=True)
        else:  # the caller's tensor, made to require grad: the argument itself is kept
            leaf = x.requires_grad_()
        loss = (model(x) + leaf.sum()).pow(2).mean()
        loss.backward()
        opt.step()
        kept["leaf"] = leaf
        return loss.detach()
    return step, kept, model


@pytest.mark.parametrize("make_leaf", [True, False])
def test_a_kept_leaf_that_requires_grad_has_eagers_grad(make_leaf: bool) -> None:
    eager, kept_eager, model_eager = _leaf_step(make_leaf)
    step, kept, model = _leaf_step(make_leaf)
    fn = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), fn(x.detach().clone())), f"call {i}"
            a, b = kept_eager["leaf"], kept["leaf"]
            assert _flags(a) == _flags(b), f"call {i}"
            assert torch.equal(a.grad, b.grad), f"call {i}"
            assert all(torch.equal(p, q) for p, q in zip(model_eager.parameters(), model.parameters()))
    refusals = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    if make_leaf:
        assert len(refusals) == 1 and "requires_grad=True" in refusals[0], refusals
    else:
        assert not refusals and fn.capture_mode == "whole-step"
