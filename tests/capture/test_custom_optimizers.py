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
from typing import Any

import pytest
import torch

from tests.helpers import assert_same_optimizer_loop, optimizer_loop


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


@pytest.mark.parametrize("optimizer", [CountingOnItself, CountingInGroups], ids=["attribute", "group"])
def test_a_custom_optimizer_s_counter_counts_in_every_replay(optimizer: type) -> None:
    eager, _ = optimizer_loop(optimizer, traced=False)
    traced, run = optimizer_loop(optimizer, traced=True)
    assert_same_optimizer_loop(eager, traced)
    assert run.capture_mode == "whole-step" and run.captures == 1


@pytest.mark.parametrize("optimizer", [CountingInState, FunctionalMomentum], ids=["int", "new tensor"])
def test_a_step_that_puts_new_values_in_optimizer_state_is_profiled_another_way_with_a_warning(
        optimizer: type) -> None:
    eager, _ = optimizer_loop(optimizer, traced=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced, run = optimizer_loop(optimizer, traced=True)
    assert_same_optimizer_loop(eager, traced)
    assert run.capture_mode == "segments"
    assert any("puts a new value in" in str(w.message) and "state[param 0]" in str(w.message) for w in caught)


def _restart_steps(i: int, opt: torch.optim.Optimizer) -> None:
    if i == 4:  # user code restarts the bias correction: new tensors in the state
        for state in opt.state.values():
            state["step"] = torch.tensor(0.0)


def test_state_tensors_the_user_replaces_between_calls_are_the_ones_a_replay_updates() -> None:
    def adam(params: Any) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=0.01)

    eager, _ = optimizer_loop(adam, traced=False, between=_restart_steps)
    traced, run = optimizer_loop(adam, traced=True, between=_restart_steps)
    assert_same_optimizer_loop(eager, traced)
    assert run.capture_mode == "whole-step" and run.captures == 2  # once, and again for the new tensors


class Lookahead(torch.optim.Optimizer):
    """timm's layout of Lookahead: wraps an optimizer, shares its groups (with a counter in each), keeps
    its slow weights in the wrapped optimizer's state, and does not call ``Optimizer.__init__``."""

    def __init__(self, base_optimizer: torch.optim.Optimizer, alpha: float = 0.5, k: int = 3) -> None:
        self._base_optimizer = base_optimizer
        self.param_groups = base_optimizer.param_groups
        self.defaults = base_optimizer.defaults
        self.state: Any = base_optimizer.state
        self._optimizer_step_pre_hooks: Any = {}
        self._optimizer_step_post_hooks: Any = {}
        self._optimizer_state_dict_pre_hooks: Any = {}
        self._optimizer_state_dict_post_hooks: Any = {}
        for group in self.param_groups:
            for name, default in {"lookahead_alpha": alpha, "lookahead_k": k, "lookahead_step": 0}.items():
                group.setdefault(name, default)

    @torch.no_grad()
    def _update_slow(self, group: dict[str, Any]) -> None:
        for fast in group["params"]:
            state = self._base_optimizer.state[fast]
            if "lookahead_slow_buff" not in state:
                state["lookahead_slow_buff"] = torch.empty_like(fast)
                state["lookahead_slow_buff"].copy_(fast)
            slow = state["lookahead_slow_buff"]
            slow.add_(fast - slow, alpha=group["lookahead_alpha"])
            fast.copy_(slow)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = self._base_optimizer.step(closure)
        for group in self.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] == 0:
                self._update_slow(group)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._base_optimizer.zero_grad(set_to_none)


def test_a_wrapper_sharing_the_groups_and_state_of_the_optimizer_it_wraps_replays_whole_step() -> None:
    """The wrapped AdamW's state (step counts, slow weights) was reached by no name, and the group
    counter the wrapper advances was seen once per optimizer sharing the group: refused, as segments."""
    def lookahead(params: Any) -> torch.optim.Optimizer:
        return Lookahead(torch.optim.AdamW(params, lr=0.01), k=3)

    eager, _ = optimizer_loop(lookahead, traced=False, calls=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced, run = optimizer_loop(lookahead, traced=True, calls=8)
    assert_same_optimizer_loop(eager, traced)
    # One graph per side of ``% k == 0``; the call that makes the slow weights (the first on the side
    # that updates them) is a try that runs eagerly, and the next one on that side is captured.
    assert run.capture_mode == "whole-step" and run.captures == 3
