"""``F.one_hot(y, n)`` in a step replays whole-step, and a class out of range raises as in eager.

torch's ``one_hot`` checks its classes with ``.item()`` reads on the host,
so any step using it refused capture and ran as segments. With ``n`` given,
it is now recorded as a scatter and two ``_assert_async`` checks carrying
torch's own messages.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof


def _dqn_step() -> tuple[Callable[..., torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    q = nn.Linear(4, 3)
    opt = torch.optim.Adam(q.parameters(), lr=0.01)

    def step(obs: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        chosen = (q(obs) * nn.functional.one_hot(actions, 3).float()).sum(-1)
        loss = nn.functional.mse_loss(chosen, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, q


def _batch(i: int, bad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(i)
    actions = torch.randint(0, 3, (8,), generator=g)
    if bad:
        actions[2] = 3
    return torch.randn(8, 4, generator=g), actions, torch.randn(8, generator=g)


def test_a_one_hot_step_replays_one_graph_equal_to_eager() -> None:
    (eager, eager_q), (step, q) = _dqn_step(), _dqn_step()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            assert torch.equal(eager(*_batch(i)), traced(*_batch(i))), f"call {i}"
            assert all(torch.equal(a, b) for a, b in zip(eager_q.parameters(), q.parameters())), f"call {i}"
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_class_out_of_range_raises_eagers_error_and_changes_nothing() -> None:
    (eager, eager_q), (step, q) = _dqn_step(), _dqn_step()
    traced = graphprof.trace(step)
    for i in range(3):
        eager(*_batch(i))
        traced(*_batch(i))
    errors: list[Any] = []
    for fn in (eager, traced):
        with pytest.raises(RuntimeError) as raised:
            fn(*_batch(3, bad=True))
        errors.append(str(raised.value))
    assert errors[0] == errors[1] == "Class values must be smaller than num_classes."
    assert all(torch.equal(a, b) for a, b in zip(eager_q.parameters(), q.parameters()))
    assert torch.equal(eager(*_batch(4)), traced(*_batch(4)))
