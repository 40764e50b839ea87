"""Optimizers written by the user (research code, a paper's update rule) and state edited by hand.

A custom optimizer's ``step`` is Python that runs only in the capture call.
What it keeps outside tensors updated in place was the capture call's in
every replay, silently: a counter on the optimizer (``self.t += 1``), one in
its groups (``group["step"] += 1``), an int or a new tensor in its
per-parameter state. So was a state tensor the user replaced between calls
(``state["step"] = torch.tensor(0.)``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


class CountingOnItself(torch.optim.Optimizer):
    """Keeps its step count as an attribute: the rate decays with it."""

    def __init__(self, params: Any, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr})
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        self.t += 1
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"] / self.t)


class CountingInGroups(torch.optim.Optimizer):
    """Keeps its step count in each parameter group."""

    def __init__(self, params: Any, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr, "step": 0})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            group["step"] += 1
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"] / group["step"])


class CountingInState(torch.optim.Optimizer):
    """Keeps a Python int per parameter in its state."""

    def __init__(self, params: Any, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = state.get("step", 0) + 1
                p.add_(p.grad, alpha=-group["lr"] * 0.9 ** state["step"])


class FunctionalMomentum(torch.optim.Optimizer):
    """Puts a new momentum tensor in its state on every step (not updated in place)."""

    def __init__(self, params: Any, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["buf"] = state.get("buf", torch.zeros_like(p)) * 0.9 + p.grad
                p.add_(state["buf"], alpha=-group["lr"])


def _run(make_optimizer: Callable[[Any], torch.optim.Optimizer], traced: bool, calls: int = 7,
         between: Callable[[int, torch.optim.Optimizer], None] = lambda i, opt: None) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = make_optimizer(model.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = graphprof.trace(step) if traced else step
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(calls):
        between(i, opt)
        losses.append(run(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)))
    return (losses, [p.detach().clone() for p in model.parameters()], opt.state_dict(),
            getattr(opt, "t", None)), run


def _assert_same(eager: Any, traced: Any) -> None:
    (losses_a, params_a, opt_a, t_a), (losses_b, params_b, opt_b, t_b) = eager, traced
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert t_a == t_b
    assert [{k: v for k, v in g.items()} for g in opt_a["param_groups"]] == opt_b["param_groups"]
    for key, state in opt_a["state"].items():
        for name, value in state.items():
            other = opt_b["state"][key][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


@pytest.mark.parametrize("optimizer", [CountingOnItself, CountingInGroups], ids=["attribute", "group"])
def test_a_custom_optimizer_s_counter_counts_in_every_replay(optimizer: type) -> None:
    eager, _ = _run(optimizer, traced=False)
    traced, run = _run(optimizer, traced=True)
    _assert_same(eager, traced)
    assert run.capture_mode == "whole-step" and run.captures == 1


@pytest.mark.parametrize("optimizer", [CountingInState, FunctionalMomentum], ids=["int", "new tensor"])
def test_a_step_that_puts_new_values_in_optimizer_state_is_profiled_another_way_with_a_warning(
        optimizer: type) -> None:
    eager, _ = _run(optimizer, traced=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced, run = _run(optimizer, traced=True)
    _assert_same(eager, traced)
    assert run.capture_mode == "segments"
    assert any("puts a new value in" in str(w.message) and "state[param 0]" in str(w.message) for w in caught)


def _restart_steps(i: int, opt: torch.optim.Optimizer) -> None:
    if i == 4:  # user code restarts the bias correction: new tensors in the state
        for state in opt.state.values():
            state["step"] = torch.tensor(0.0)


def test_state_tensors_the_user_replaces_between_calls_are_the_ones_a_replay_updates() -> None:
    def adam(params: Any) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=0.01)

    eager, _ = _run(adam, traced=False, between=_restart_steps)
    traced, run = _run(adam, traced=True, between=_restart_steps)
    _assert_same(eager, traced)
    assert run.capture_mode == "whole-step" and run.captures == 2  # once, and again for the new tensors
