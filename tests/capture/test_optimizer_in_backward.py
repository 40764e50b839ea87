"""Optimizers stepped from the parameters' gradient hooks (torch's "optimizer in backward") replay as
those stepped in the step's body do.

The tutorial keeps one optimizer per parameter in a dict its hook closes over
(``p.register_post_accumulate_grad_hook(lambda p: opts[p].step())``): the
step reaches them through no name of its own. Their state was then no state
the graph knew, and SGD's momentum buffer refused the capture as an unknown
tensor, where the same SGD stepped in the body replays. The hooks' optimizers
are found with the step's (capture/state.py, ``hooked_optimizers``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 5

_OPTIMIZERS: dict[str, Callable[[nn.Parameter], torch.optim.Optimizer]] = {
    "sgd momentum": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9),
    "sgd": lambda p: torch.optim.SGD([p], lr=0.1),
    "adam": lambda p: torch.optim.Adam([p], lr=0.01, foreach=False),
}


def _make(kind: str) -> tuple[nn.Module, dict[Any, torch.optim.Optimizer], Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizers = {p: _OPTIMIZERS[kind](p) for p in model.parameters()}

    def hook(parameter: nn.Parameter) -> None:
        optimizers[parameter].step()
        optimizers[parameter].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    return model, optimizers, step


def _compare(kind: str) -> tuple[Any, list[str]]:
    eager_model, eager_opts, eager = _make(kind)
    model, opts, step = _make(kind)
    traced = graphprof.trace(step)
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"call {i}"
            for (name, a), b in zip(eager_model.named_parameters(), model.parameters()):
                assert torch.equal(a, b) and (a.grad is None) == (b.grad is None), f"call {i}: {name}"
            for a, b in zip(eager_opts.values(), opts.values()):
                sa, sb = a.state_dict()["state"], b.state_dict()["state"]
                assert sa.keys() == sb.keys(), f"call {i}"
                for k in sa:
                    assert sa[k].keys() == sb[k].keys(), f"call {i}"
                    for key, value in sa[k].items():
                        assert torch.equal(value, sb[k][key]), f"call {i}: {key}"
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


@pytest.mark.parametrize("kind", ["sgd momentum", "sgd"])
def test_optimizers_stepped_in_the_backward_replay_whole_step_as_eager(kind: str) -> None:
    traced, warned = _compare(kind)
    assert warned == []
    assert traced.capture_mode == "whole-step"


def test_adam_stepped_in_the_backward_gives_eager_results() -> None:
    """Its step count is read with ``.item()`` inside the backward, which the capture does not see as
    the body's read: refused, with one warning, and run as segments."""
    _, warned = _compare("adam")
    assert len(warned) <= 1, warned
