"""Branches on tensor values computed from the step's inputs (capture/value_guards.py).

The branch's outcome is a guard checked before a replay runs anything; a
different outcome captures the other path. Values a prefix of the graph
cannot recompute from the inputs alone refuse the capture, with a warning,
and the step is profiled as segments: never silently wrong.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from tests.helpers import assert_bitwise_against_eager

_FULL = torch.ones(4, dtype=torch.bool)
_PADDED = torch.tensor([True, True, True, False])


def _masked_step(branch: Callable[..., bool]) -> Callable[[], tuple[nn.Module, Any]]:
    def make() -> tuple[nn.Module, Any]:
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        holder = {"limit": 2}

        def step(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            y = model(x).squeeze(-1)
            if branch(x, mask, model, holder):
                y = y.masked_fill(~mask, 0.0)
            loss = y.pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return model, step

    return make


def _inputs(masks: list[torch.Tensor]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        return x, masks[i].clone()
    return inputs


_SCHEDULE = [_FULL, _FULL, _FULL, _PADDED, _PADDED, _FULL, _PADDED, _FULL]


def test_branch_on_an_input_mask_takes_the_other_path_on_a_later_call() -> None:
    traced = assert_bitwise_against_eager(_masked_step(lambda x, mask, m, h: not mask.all()),
                                          _inputs(_SCHEDULE), len(_SCHEDULE), profiling=True)
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2  # one graph per path, each replayed afterwards
    guards = traced.get_profile().meta.extra["guards"]
    assert any(g.startswith("bool(all(") and g.endswith(f"test_value_guards.py:{_line('not mask.all()')}")
               for g in guards), guards


def test_value_computed_from_inputs_and_python_state_is_guarded() -> None:
    """``mask.sum() > holder['limit']``: tensor ops on inputs and a number the step keeps."""
    traced = assert_bitwise_against_eager(
        _masked_step(lambda x, mask, m, h: bool((mask.sum() - h["limit"] > 1) & (x.abs().max() > 0))),
        _inputs(_SCHEDULE), len(_SCHEDULE))
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2


def test_item_of_a_value_computed_from_inputs_is_an_input_scalar() -> None:
    """``.item()`` of an input-derived tensor: comparisons on the number are guards too."""
    traced = assert_bitwise_against_eager(_masked_step(lambda x, mask, m, h: mask.sum().item() < 4),
                                          _inputs(_SCHEDULE), len(_SCHEDULE))
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2


def _line(text: str) -> int:
    import inspect
    lines, first = inspect.getsourcelines(test_branch_on_an_input_mask_takes_the_other_path_on_a_later_call)
    return next(first + i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("branch, reason", [
    (lambda x, mask, m, h: bool(m[0].weight.sum() > 0), "state"),
    (lambda x, mask, m, h: bool(torch.rand(()) > 0.5) or True, "random numbers"),
    (lambda x, mask, m, h: bool(mask.logical_not_().logical_not_().all()), "writes in place into an input"),
    (lambda x, mask, m, h: bool(m(x).sum() > -1e9), "state"),
], ids=["parameter", "random", "in-place-on-input", "model-output"])
def test_values_a_prefix_cannot_recompute_refuse_with_one_warning(branch: Any, reason: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_masked_step(branch), _inputs(_SCHEDULE), 4)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and reason in messages[0], messages
    assert traced.capture_mode == "segments"


def test_branch_on_an_input_written_earlier_in_the_step_refuses() -> None:
    def branch(x: torch.Tensor, mask: torch.Tensor, m: nn.Module, h: dict) -> bool:
        mask[0] = False  # the user's tensor, written before the branch reads it
        return not mask.all()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_masked_step(branch), _inputs(_SCHEDULE), 4)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "writes in place earlier" in messages[0], messages
    assert traced.capture_mode == "segments"



class _WarmUp(nn.Module):
    """Counts its calls in a buffer it replaces (not in place) and scales its output after two."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        out = self.lin(x)
        return out * 0.5 if self.calls > 2 else out


def test_a_branch_on_a_counter_buffer_the_step_replaces_reads_the_buffer_the_call_finds() -> None:
    """The graph reads a buffer the step replaces where it is kept; the check of a branch on it reads
    it there too, not the tensor the capture call found (which would answer for that call forever)."""
    def make() -> tuple[nn.Module, Any]:
        model = _WarmUp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    traced = assert_bitwise_against_eager(make, lambda i: (torch.full((2, 4), float(i + 1)),), 6)
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2  # calls 2 and 3 (a count of 2, then 3); every later call replays


def test_a_branch_on_a_tensor_the_step_closes_over_replays_without_capturing_again() -> None:
    """The check of ``(x @ w) > 0`` reads the closure's ``w`` where the graph reads it."""
    w = torch.tensor([1.0, -1.0, 0.5, 0.0])

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if (x @ w) > 0 else x - 1

    traced = graphprof.trace(step, capture="fx")
    xs = [torch.full((4,), 1.0 if i % 3 else -1.0) for i in range(8)]
    assert all(torch.equal(traced(x), step(x)) for x in xs)
    assert traced.captures == 2  # one graph for each way of the branch
