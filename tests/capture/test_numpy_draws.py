"""A step that draws from a numpy generator it keeps refuses, and the generator moves as in eager.

``torch.from_numpy(rng.random(x.shape) > 0.5)`` with ``rng`` a
``np.random.default_rng`` or ``RandomState`` made the capture call's mask a
constant of the graph: every replay used it and ``rng`` never advanced,
silently. Each case is compared with eager after every call: the output and
the generator's state.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import graphprof

CALLS = 4


def _rng(kind: str) -> Any:
    return np.random.RandomState(0) if kind == "RandomState" else np.random.default_rng(0)


def _draw(rng: Any, shape: tuple[int, ...]) -> np.ndarray:
    return rng.random_sample(shape) if isinstance(rng, np.random.RandomState) else rng.random(shape)


def _state(rng: Any) -> bytes:
    bits = getattr(rng, "bit_generator", None) or rng._bit_generator
    return pickle.dumps(bits.state)


class _Masked(nn.Module):
    """Keeps its generator as an attribute and draws from it in ``forward``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.linear, self.rng = nn.Linear(6, 1), _rng(kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * torch.from_numpy(_draw(self.rng, x.shape) > 0.5).float())


def _closure(kind: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], Any]:
    rng = _rng(kind)

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * torch.from_numpy(_draw(rng, x.shape) > 0.5).float()
    return step, rng


def _module(kind: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], Any]:
    torch.manual_seed(0)
    model = _Masked(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if loss.item() > 1e9:  # a second refusal, after the draw: the draw is put back too
            print("diverged")
        return loss.detach()
    return step, model.rng


@pytest.mark.parametrize("kind", ["RandomState", "Generator"])
@pytest.mark.parametrize("make", [_closure, _module], ids=["closure", "module attribute"])
def test_a_step_drawing_from_a_numpy_generator_refuses_and_matches_eager(make: Callable[..., Any], kind: str) -> None:
    eager, eager_rng = make(kind)
    step, rng = make(kind)
    traced = graphprof.trace(step)
    x = torch.ones(2, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            assert torch.equal(eager(x), traced(x)), f"call {i}"
            assert _state(eager_rng) == _state(rng), f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert traced.capture_mode == "segments"
    assert len(messages) == 1, messages
