"""A step that registers a hook on every call gets eager's hook calls, whole-step or not.

``register_multi_grad_hook(params, fn)``, a module's forward or backward hook,
an optimizer's step hook or a global one registered in the step's body leaves
one more each call: eager runs n of them in call n. A replay ran as many as
the capture call had, forever after, and a refused capture left its own hook
behind, one too many for the fallback. Now a capture call that leaves a hook
stands without its graph; a second one in a row runs the step eagerly, after
one warning, and a refused capture takes its hooks back. A hook installed
once behind a flag costs one capture; one on the call's own activations, or
removed before the step returns, is the same on every call and replays
(capture/registered_hooks.py).
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.optim import optimizer as optimizer_globals
from torch.optim.optimizer import register_optimizer_step_post_hook

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


def test_a_multi_grad_hook_on_the_parameters_every_call_runs_eagerly_and_counts_as_eager() -> None:
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


# -- module, optimizer and global hooks -------------------------------------------------------------

#: Calls of each comparison: a per-call hook is refused on the second capture (call 3), and then must
#: keep eager's count for several calls more.
MANY = 7


class _Step:
    """A model, its optimizer and what its hooks count, with a step that registers a hook as ``register``
    says: on every call, once behind a flag (``lazy``), or for the call alone (``removed``)."""

    def __init__(self, register: str, refused: bool = False) -> None:
        torch.manual_seed(0)
        self.refused = refused  # whether its capture is refused for another reason too
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.register = register
        self.seen = {"calls": 0, "sum": torch.zeros(())}

    def count(self, value: torch.Tensor | None = None) -> None:
        self.seen["calls"] += 1
        if value is not None:
            self.seen["sum"] += value.detach().sum()

    def step(self, x: torch.Tensor, collect: bool, n: int) -> torch.Tensor:
        model, opt, count = self.model, self.opt, self.count
        kind = self.register
        if kind == "forward":
            model[0].register_forward_hook(lambda m, args, out: count(out))
        elif kind == "full backward":
            model[2].register_full_backward_hook(lambda m, grad_in, grad_out: count(grad_out[0]))
        elif kind == "optimizer step post":
            opt.register_step_post_hook(lambda o, args, kwargs: count())
        elif kind == "global forward":
            nn.modules.module.register_module_forward_hook(lambda m, args, out: count(out))
        elif kind == "global optimizer":
            register_optimizer_step_post_hook(lambda o, args, kwargs: count())
        elif kind == "lazy" and collect and "_counting" not in vars(model):  # as a library installs it
            model._counting = True
            model[0].register_forward_hook(lambda m, args, out: count(out))
        elif kind == "removed":
            handle = model[0].register_forward_hook(lambda m, args, out: count(out))
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if kind == "removed":
            handle.remove()
        if self.refused:  # a number read anew on every call, given to code that wants a plain one
            json.dumps(n)
        return loss.detach()


def _observed(twin: _Step, loss: torch.Tensor) -> list[Any]:
    """What the user sees after a call: the loss, what the hooks counted, the parameters and their
    gradients, and how many hooks each module, the optimizer and torch's globals hold."""
    return [loss, twin.seen["calls"], twin.seen["sum"].clone(),
            *(t.detach().clone() for p in twin.model.parameters() for t in (p, p.grad)),
            [(len(m._forward_hooks), len(m._backward_hooks)) for m in twin.model.modules()],
            len(twin.opt._optimizer_step_post_hooks), [len(hooks) for hooks in _GLOBAL_HOOKS]]


#: torch's global hook dicts the steps register on (the test takes its hooks out again: ``_remove_added``).
_GLOBAL_HOOKS = [nn.modules.module._global_forward_hooks, optimizer_globals._global_optimizer_post_hooks]


def _remove_added(before: list[set[int]]) -> None:
    for hooks, keys in zip(_GLOBAL_HOOKS, before):
        for key in [key for key in hooks if key not in keys]:
            del hooks[key]


def _compare_hooks(register: str, refused: bool = False) -> tuple[Any, list[str]]:
    """Eager and traced twins over ``MANY`` calls (``collect`` switched on from the capture call's call
    on, where a user first asks for what a lazy hook collects); returns the traced step and graphprof's
    warnings. The eager twin runs all its calls first, and its global hooks are removed before the traced
    one runs: torch's globals would run each twin's hooks on the other's modules too."""
    inputs = [(torch.randn(5, 4, generator=torch.Generator().manual_seed(i)), i >= 1, i) for i in range(MANY)]
    before = [set(hooks) for hooks in _GLOBAL_HOOKS]
    eager = _Step(register, refused)
    try:
        expected = [_observed(eager, eager.step(*args)) for args in inputs]
    finally:
        _remove_added(before)
    twin = _Step(register, refused)
    traced = graphprof.trace(twin.step, profiling=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, args in enumerate(inputs):
                got = _observed(twin, traced(*args))
                for a, b in zip(expected[i], got, strict=True):
                    assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f"call {i}"
    finally:
        _remove_added(before)
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


@pytest.mark.parametrize("register", ["forward", "full backward", "optimizer step post", "global forward",
                                      "global optimizer"])
def test_a_hook_registered_on_every_call_runs_as_often_as_eager_after_one_warning(register: str) -> None:
    traced, warned = _compare_hooks(register)
    assert len(warned) == 1 and "leaves it so" in warned[0], warned
    assert traced.capture_mode is None  # eager, unprofiled


def test_a_hook_installed_once_with_a_flag_costs_one_capture_and_replays_whole_step() -> None:
    traced, warned = _compare_hooks("lazy")
    assert warned == []
    assert traced.capture_mode == "whole-step" and traced.captures == 2  # the installing call's graph is not kept


def test_a_module_hook_registered_and_removed_within_the_call_replays_whole_step() -> None:
    traced, warned = _compare_hooks("removed")
    assert warned == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_capture_refused_for_another_reason_takes_back_a_lazy_hook_with_its_flag() -> None:
    """The flag is a new attribute of the model, which only the hook's own put-back takes away: without
    it, the fallback's run found the flag set and the hook gone, and never counted again."""
    traced, warned = _compare_hooks("lazy", refused=True)
    assert "plain number" in warned[0], warned  # (segments then recompile for each new n: warned too)
    assert traced.capture_mode == "segments"


@pytest.mark.parametrize("register", ["forward", "optimizer step post", "global optimizer"])
def test_a_hook_registered_on_every_call_of_a_refused_step_runs_as_often_as_eager(register: str) -> None:
    """The refused capture takes its hook back, and segments run the rest: their optimizer graph, captured
    once, ran the hooks it found, until an optimizer hook added since captures it again."""
    traced, _ = _compare_hooks(register, refused=True)
    assert traced.capture_mode == "segments"
