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
from torch.distributions import Categorical, Normal

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
