"""Modules changed between calls (a parameter, buffer or submodule assigned, a hook added or removed)
replay as eager runs them; changes elsewhere cost no capture."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

import graphprof
from graphprof.tracing import TracedFunction


class _Loop:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss


#: Hook handles, kept where the step cannot reach them (its own attributes would be held values).
HANDLES: dict[int, list[Any]] = {}


def _double(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 2


def _halve(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 0.5


def _shrink(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                p.mul_(0.5)


def _swap_bias(loop: _Loop) -> None:
    with torch.no_grad():
        loop.model[2].bias = nn.Parameter(torch.full((1,), 0.5))
    loop.opt.param_groups[0]["params"][-1] = loop.model[2].bias


CHANGES: dict[str, Callable[[int, _Loop], Any]] = {
    "a parameter assigned": lambda i, t: _swap_bias(t) if i == 4 else None,
    "a buffer assigned": lambda i, t: t.model[1].register_buffer("unused", torch.ones(1)) if i == 4 else None,
    "a submodule replaced": lambda i, t: t.model.__setitem__(1, nn.Tanh()) if i == 4 else None,
    "a forward hook added and removed": lambda i, t: (
        HANDLES.setdefault(id(t), []).append(t.model[0].register_forward_hook(_double)) if i == 3
        else HANDLES[id(t)].pop().remove() if i == 6 else None),
    "a gradient hook on a parameter added and removed": lambda i, t: (
        HANDLES.setdefault(id(t), []).append(t.model[0].weight.register_hook(lambda g: g * 2)) if i == 3
        else HANDLES[id(t)].pop().remove() if i == 6 else None),
    "an optimizer step hook added and removed": lambda i, t: (
        HANDLES.setdefault(id(t), []).append(t.opt.register_step_post_hook(_shrink)) if i == 3
        else HANDLES[id(t)].pop().remove() if i == 6 else None),
    "a gradient hook on a parameter there from the start, removed": lambda i, t: (
        HANDLES.setdefault(id(t), []).append(t.model[2].bias.register_hook(lambda g: g * 0.5)) if i == 0
        else HANDLES[id(t)].pop().remove() if i == 5 else None),
}


def _compare(change: Callable[[int, _Loop], Any], calls: int = 9,
             shared: Callable[[int], Any] = lambda i: None) -> TracedFunction:
    """Eager and traced copies, each changed by ``change`` before a call; ``shared`` changes what
    both see (a global hook) once per call."""
    eager, copy = _Loop(), _Loop()
    traced = graphprof.trace(copy.step)
    try:
        for i in range(calls):
            shared(i)
            change(i, eager)
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
            expected = eager.step(x, y)
            change(i, copy)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = traced(x, y)
            assert torch.equal(expected, got), f"loss differs after call {i}"
            for a, b in zip(eager.model.parameters(), copy.model.parameters()):
                assert torch.equal(a, b), f"parameters differ after call {i}"
    finally:
        for loop in (eager, copy):
            for handle in HANDLES.pop(id(loop), []):
                handle.remove()
    return traced


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_changed_module_replays_as_eager(name: str) -> None:
    traced = _compare(CHANGES[name])
    assert traced.captures >= 2 and traced.capture_mode == "whole-step"


def test_a_global_forward_hook_added_and_removed() -> None:
    handles: list[Any] = []

    def shared(i: int) -> None:
        if i == 3:
            handles.append(nn.modules.module.register_module_forward_hook(_halve))
        elif i == 6:
            handles.pop().remove()

    try:
        traced = _compare(lambda i, t: None, shared=shared)
    finally:
        for handle in handles:
            handle.remove()
    assert traced.captures >= 2 and traced.capture_mode == "whole-step"


def test_a_global_optimizer_hook_added_and_removed() -> None:
    handles: list[Any] = []

    def shared(i: int) -> None:
        if i == 3:
            handles.append(register_optimizer_step_post_hook(_shrink))
        elif i == 6:
            handles.pop().remove()

    try:
        traced = _compare(lambda i, t: None, shared=shared)
    finally:
        for handle in handles:
            handle.remove()
    assert traced.captures >= 2 and traced.capture_mode == "whole-step"


def test_changes_elsewhere_are_looked_at_once_and_cost_no_capture() -> None:
    """A module built, a tensor hook registered: the counts move, nothing of this graph changed."""
    others: list[Any] = []

    def elsewhere(i: int, loop: _Loop) -> None:
        others.append(nn.Linear(2, 2))  # registers parameters on a module the step never runs
        others.append(torch.zeros(1, requires_grad=True).register_hook(lambda g: g))  # a hook id taken

    traced = _compare(elsewhere)
    assert traced.captures == 1


def test_counting_registrations_never_breaks_a_module_that_cannot_be_hashed() -> None:
    """The registration hook runs inside the user's register_parameter: a module class with ``__eq__``
    and no ``__hash__`` still registers, and its change is still seen."""
    from graphprof.capture.module_structure import REGISTRATIONS

    class Compared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2))

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Compared)

    REGISTRATIONS.install()
    module = Compared()
    assert Compared.__hash__ is None
    before = REGISTRATIONS.count
    module.weight = nn.Parameter(torch.zeros(2))
    assert REGISTRATIONS.count == before + 1 and REGISTRATIONS.last(module) == REGISTRATIONS.count


class _Replacing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.mean(0)  # a buffer registration on every call
        return self.linear(x - self.mean)


def test_a_compiled_forward_that_replaces_a_buffer_compiles_once() -> None:
    """The counting hook is kept out of dynamo: traced, it made every call compile the forward again."""
    from graphprof.capture.module_structure import REGISTRATIONS

    REGISTRATIONS.install()
    torch.manual_seed(0)
    model = _Replacing()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    traced = graphprof.trace(step, capture="dynamo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            traced(torch.randn(5, 4), torch.randn(5, 1))
    assert not [w for w in caught if "after the first call" in str(w.message)]


class _QuickGELU(nn.Module):
    """CLIP's activation, scripted as CLIP's code scripts it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def test_a_scripted_submodule_is_captured_and_replayed() -> None:
    """The check of a module's members iterated each member dict; a scripted module's are wrappers that
    cannot be iterated, and the capture call raised a TypeError into the step, where eager runs."""
    optimize = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)  # the JIT's own profiling runs alike in both copies
    try:
        def make() -> tuple[nn.Module, Any]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), torch.jit.script(_QuickGELU()), nn.Linear(16, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)

            def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                return loss.detach()
            return model, step

        (eager_model, eager), (model, step) = make(), make()
        traced = graphprof.trace(step)
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"call {i}"
            assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"
        assert traced.capture_mode == "whole-step"
    finally:
        torch._C._set_graph_executor_optimize(optimize)
