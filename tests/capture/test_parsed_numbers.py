"""A 0-dim tensor the step passes where an op takes a number is read by every replay
(capture/parsed_numbers.py).

``w.add_(v, alpha=t)`` with ``t`` a tensor: torch's argument parser reads
``t`` as a number before the op runs. A tensor the step keeps (a scale it
decays in place) was read once, by the capture call, and every replay used
that number, silently; one the step computes refused the capture. Both now
replay one graph whose op takes the number the replay reads.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import assert_bitwise_against_eager


def _step(kind: str) -> Callable[[], tuple[nn.Module, Any]]:
    def make() -> tuple[nn.Module, Any]:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        kept = {"scale": torch.tensor(0.5)}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            with torch.no_grad():
                if kind == "kept":  # decayed in place below: another number every call
                    model[0].weight.add_(model[0].weight, alpha=kept["scale"])
                    kept["scale"].mul_(0.9)
                else:
                    model[0].weight.addcmul_(model[0].weight, model[0].weight, value=-loss.detach() * 1e-2)
            return loss.detach()
        return model, step
    return make


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


@pytest.mark.parametrize("kind", ["kept", "computed"])
def test_a_tensor_read_as_a_number_argument_replays_with_each_calls_value(kind: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_step(kind), _inputs, calls=6, profiling=True)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_a_number_read_for_a_backward_that_keeps_it_is_refused() -> None:
    """``x.add(x, alpha=t)`` of a tensor that requires grad, ``t`` computed from the weights: the backward
    keeps the number (``grad * t``), which a graph would replay as the capture call's; refused with one
    warning, equal to eager."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            out = model(x)
            loss = F.mse_loss(out.add(out, alpha=model.weight.detach().abs().mean()), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, _inputs, calls=4, profiling=True)
    warned = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(warned) == 1 and "backward keeps it as a number" in warned[0], warned
    assert traced.capture_mode != "whole-step"


@pytest.mark.parametrize("use", ["index", "narrow"])
def test_a_kept_index_tensor_the_step_advances_is_refused_not_kept(use: str) -> None:
    """``out[k]`` and ``out.narrow(0, k, 2)`` with ``k`` a 0-dim tensor the step keeps and advances in place
    (a ring position, 0, 1, 2, 0, ...): torch reads ``k`` as an index, which a graph would hold. Every
    replay used the capture call's position, silently; the capture is refused now, with one warning."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        kept = {"k": torch.tensor(0)}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            out = model(x)
            out = out[kept["k"]] if use == "index" else out.narrow(0, kept["k"], 2)
            loss = out.square().mean()
            loss.backward()
            opt.step()
            with torch.no_grad():
                kept["k"].add_(1).remainder_(3)
            return loss.detach()
        return model, step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, _inputs, calls=6, profiling=True)
    warned = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(warned) == 1 and "_local_scalar_dense" in warned[0], warned
    assert traced.capture_mode == "segments"
