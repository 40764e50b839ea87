"""Numbers read from tensors (``.item()``) that a graph would have kept as the capture call's constant.

A number read from a tensor is a ``TracedScalar`` during capture, and the op
nodes it reaches are linked to the node computing it, so a replay computes
it anew. Where no node takes it, the graph held the capture call's number,
and replays used it silently:

* ``torch.tensor(loss.item() * 2)``: the new tensor's data was a constant.
  One such number is now made with ``torch.scalar_tensor``, which takes it;
  any other call that leaves one unlinked refuses the capture.
* ``loss * loss.item()``: autograd keeps the number for the backward, in
  C++, as a literal the backward's nodes hold. Refused.
* A foreach optimizer's list of bias corrections, one per parameter, equal
  while the step counts are: every item was linked to the first parameter's
  count, so once a parameter skipped a step (no gradient that call), its
  update used another parameter's count.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import assert_bitwise_against_eager, two_heads_adam

CALLS = 6


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _scaled_by(number: Callable[[float], Any]) -> Callable[[], tuple[nn.Module, Any]]:
    """A step whose loss is scaled by a tensor made from the loss's own value."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            scale = number(loss.item() * 2)
            (loss * scale).backward()
            opt.step()
            return loss.detach(), scale
        return model, step
    return make


def _refusals(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "cannot capture step" in str(w.message)]


@pytest.mark.parametrize("number", [torch.tensor, torch.as_tensor, lambda v: torch.tensor(v, dtype=torch.float64)],
                         ids=["tensor", "as_tensor", "tensor float64"])
def test_a_tensor_made_of_a_read_number_is_made_anew_on_every_replay(number: Callable[[float], Any]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_scaled_by(number), _batch, CALLS, profiling=True)
    assert not _refusals(caught)
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_read_numbers_assigned_into_a_kept_tensor_are_assigned_anew_on_every_replay() -> None:
    """``history[i % 2] = loss.item()``: the assigned value was a constant of the graph (the history
    differed from the fourth call); it is now a ``scalar_tensor`` of the history's dtype."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        history = torch.zeros(4, dtype=torch.float64)

        def step(x: torch.Tensor, y: torch.Tensor, i: int) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            history[i % 2] = loss.item()
            history[2:] = loss.item() * 2
            return history.clone()
        return model, step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, lambda i: (*_batch(i), i), CALLS, profiling=True)
    assert not _refusals(caught)
    assert traced.capture_mode == "whole-step" and traced.captures == 2  # one path per index


@pytest.mark.parametrize("case", ["a list of read numbers", "a read number scaling a differentiable result"])
def test_a_read_number_the_graph_would_keep_refuses_the_capture_and_the_step_stays_eager_equal(case: str) -> None:
    if case == "a list of read numbers":
        make = _scaled_by(lambda v: torch.tensor([v, 1.0]).sum())
        expected = "torch.tensor"
    else:
        make = _scaled_by(lambda v: v)  # loss * number: MulBackward keeps the number
        expected = "whose backward keeps it as a number"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, _batch, CALLS, profiling=True)
    refusals = _refusals(caught)
    assert len(refusals) == 1 and ".item()" in refusals[0] and expected in refusals[0], refusals
    assert "test_read_numbers.py:" in refusals[0]  # the user's line
    assert traced.capture_mode != "whole-step"


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
def test_each_parameter_keeps_its_own_step_count_once_the_counts_differ(foreach: bool) -> None:
    traced = assert_bitwise_against_eager(two_heads_adam(foreach), lambda i: (*_batch(i), i in (0, 1) or i % 3 == 0),
                                          10, profiling=True)
    assert traced.capture_mode == "whole-step" and traced.captures == 2


def _viewed_by(size: Callable[[torch.Tensor, torch.Tensor], Any]) -> Callable[[], tuple[nn.Module, Any]]:
    """A step viewing an activation with a size given as a tensor, which torch reads as a number."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            h = model(x)
            h = h.view(h.size(0), size(h, y), 4)
            loss = h.square().mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


def test_a_size_computed_as_a_tensor_from_constants_replays_whole_step() -> None:
    """Longformer's ``_chunk``: ``torch.div(h.size(1), w, rounding_mode="trunc")`` is a tensor made from
    two ints, which ``view`` reads as a number. Every Longformer step was refused for that read; the
    number is the same on every call, as its constants are."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(
            _viewed_by(lambda h, y: torch.div(h.size(1), 4, rounding_mode="trunc")), _batch, CALLS)
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    assert not [w for w in caught if "graphprof" in str(w.message)]


def test_a_size_read_from_a_tensor_the_call_gives_still_refuses() -> None:
    """The same read of a number computed from an argument's values: not a constant; refused, as before."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(
            _viewed_by(lambda h, y: (y.abs() * 0 + 0.5).sum().long()), _batch, CALLS)
    assert traced.capture_mode == "segments"
    refusals = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    assert len(refusals) == 1 and "_local_scalar_dense" in refusals[0], refusals
