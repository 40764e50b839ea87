"""torch.distributions' checks are made by every replay (capture/distribution_checks.py).

``Categorical(logits=policy(obs))`` validates its logits and ``log_prob``
its sample by default: branches on tensors of the model, which refused the
capture, so every REINFORCE step ran as segments.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

import graphprof


def _reinforce() -> tuple[Callable[..., Any], nn.Module]:
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def step(obs: torch.Tensor, returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = Categorical(logits=policy(obs))
        action = dist.sample()
        noise = Normal(policy(obs)[:, 0], 1.0).rsample()
        loss = -(dist.log_prob(action) * returns).mean() + noise.pow(2).mean() - 0.01 * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), action

    return step, policy


def test_a_reinforce_step_with_validating_distributions_replays_whole_step() -> None:
    (eager, eager_policy), (step, policy) = _reinforce(), _reinforce()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(5):
            obs, returns = torch.randn(6, 4), torch.randn(6)
            torch.manual_seed(100 + i)
            a = eager(obs, returns)
            torch.manual_seed(100 + i)
            b = traced(obs, returns)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"call {i}"
            for p, q in zip(eager_policy.parameters(), policy.parameters()):
                assert torch.equal(p, q), f"call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    ops = {node.op for g in traced.get_profile().graphs for node in g.nodes}
    assert "host.torch.distributions check" in ops


@pytest.mark.parametrize("bad_call", [1, 3])
def test_values_that_fail_a_check_raise_eagers_error_where_eager_raises_it(bad_call: int) -> None:
    """Call 1 captures, call 3 replays: either way the caller gets eager's ValueError and message,
    nothing is updated, and later good calls go on."""
    def make() -> tuple[Callable[..., Any], nn.Module]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
            dist = Categorical(probs=probs * model(x).sigmoid())
            loss = -dist.log_prob(torch.zeros(4, dtype=torch.long)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        return step, model

    def run(fn: Callable[..., Any], model: nn.Module) -> list[Any]:
        seen: list[Any] = []
        for i in range(6):
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            probs = torch.full((4, 3), 0.5)
            if i == bad_call:
                probs[2, 1] = -1.0  # a negative probability: the argument check fails
            try:
                seen.append(fn(x, probs))
            except ValueError as exc:
                seen.append(str(exc))
            seen.append([p.clone() for p in model.parameters()])
        return seen

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    expected, got = run(eager, eager_model), run(traced, model)
    for a, b in zip(expected, got):
        if isinstance(a, list):
            assert all(torch.equal(p, q) for p, q in zip(a, b))
        elif isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b and "Expected parameter probs" in a  # eager's own message
    assert traced.capture_mode == "whole-step"


def _policy_step() -> tuple[Callable[..., Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = -Categorical(logits=model(x)).log_prob(action).mean()  # two checks: the logits, the action
        loss.backward()
        opt.step()
        return loss.detach()

    return step, model


def _run_policy(fn: Callable[..., Any], model: nn.Module, bad_call: int, switch: Callable[[int], None]) -> list[Any]:
    seen: list[Any] = []
    for i in range(6):
        switch(i)
        g = torch.Generator().manual_seed(i)
        x, action = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
        try:
            seen.append(fn(x, action + 5 if i == bad_call else action).tolist())
        except ValueError as exc:
            seen.append(str(exc))
        seen.append([p.tolist() for p in model.parameters()])
    return seen


def test_a_failing_sample_check_after_a_passing_argument_check_gives_eagers_message() -> None:
    """The argument check that passed ran before the failing one: it changed nothing, so the step runs
    eagerly and raises eager's own error."""
    (eager, eager_model), (step, model) = _policy_step(), _policy_step()
    traced = graphprof.trace(step, profiling=False)
    expected = _run_policy(eager, eager_model, 3, lambda i: None)
    assert _run_policy(traced, model, 3, lambda i: None) == expected
    assert any(isinstance(v, str) and "Expected value argument" in v for v in expected)


def test_turning_validation_back_on_makes_the_checks_again() -> None:
    """A graph captured with ``set_default_validate_args(False)`` has no checks: the default is held.
    A negative scale computes a log-density silently where eager raises."""
    def make() -> tuple[Callable[..., Any], nn.Module]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = -Normal(model(x).squeeze(1), scale).log_prob(torch.zeros(5)).mean()
            loss.backward()
            opt.step()
            return loss.detach()

        return step, model

    def run(fn: Callable[..., Any], model: nn.Module) -> list[Any]:
        seen: list[Any] = []
        for i in range(6):
            Distribution.set_default_validate_args(i not in (1, 2))
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
            try:
                seen.append(fn(x, torch.full((5,), -1.0 if i == 4 else 1.0)).tolist())
            except ValueError as exc:
                seen.append(str(exc))
            seen.append([p.tolist() for p in model.parameters()])
        return seen

    (eager, eager_model), (step, model) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    try:
        expected = run(eager, eager_model)
        got = run(traced, model)
    finally:
        Distribution.set_default_validate_args(True)
    assert got == expected
    assert any(isinstance(v, str) and "Expected parameter scale" in v for v in expected)
