"""A step that registers a hook on every call gets eager's hook calls, whole-step or not.

``register_multi_grad_hook(params, fn)`` in the step's body leaves one more
hook on the parameters each call: eager's ``fn`` runs n times in call n. A
replay ran it as often as the capture call had, forever after, and a refused
capture left its own hook behind, one too many for the fallback. Such a step
now refuses with one warning and the capture call's hooks are taken back; a
hook on the call's own activations, or one removed before the step returns,
is the same on every call and replays (capture/registered_hooks.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 5


def _make(register: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {"calls": 0, "grads": 0}

    def hook(grads: Any) -> None:
        seen["calls"] += 1
        seen["grads"] += sum(g is not None for g in grads)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        hidden = model[0](x)
        out = model[2](model[1](hidden))
        if register == "parameters":
            torch.autograd.graph.register_multi_grad_hook(list(model.parameters()), hook)
        elif register == "activations":
            torch.autograd.graph.register_multi_grad_hook([hidden, out], hook)
        else:  # "removed": registered and taken off again within the call
            handle = torch.autograd.graph.register_multi_grad_hook(list(model.parameters()), hook)
        loss = out.pow(2).mean()
        loss.backward()
        if register == "removed":
            handle.remove()
        opt.step()
        return loss.detach()
    return step, seen, model


def _compare(register: str) -> Any:
    eager, seen_eager, model_eager = _make(register)
    step, seen, model = _make(register)
    traced = graphprof.trace(step, profiling=True)
    for i in range(CALLS):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager(x), traced(x)), f"call {i}"
        assert seen == seen_eager, f"call {i}"
        for a, b in zip(model_eager.parameters(), model.parameters()):
            assert torch.equal(a, b) and torch.equal(a.grad, b.grad), f"call {i}"
            assert len(a._backward_hooks or {}) == len(b._backward_hooks or {}), f"call {i}"
    return traced


def test_a_multi_grad_hook_on_the_parameters_every_call_refuses_and_counts_as_eager() -> None:
    with pytest.warns(UserWarning, match="register_multi_grad_hook") as caught:
        traced = _compare("parameters")
    assert sum("graphprof" in str(w.message) for w in caught) == 1
    assert traced.capture_mode != "whole-step"


@pytest.mark.parametrize("register", ["activations", "removed"])
def test_a_hook_that_does_not_outlive_the_call_replays_whole_step(register: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning
        traced = _compare(register)
    assert traced.capture_mode == "whole-step"
