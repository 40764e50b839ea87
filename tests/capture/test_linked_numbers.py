"""A number the step passes to torch is linked where it was passed, not wherever its value appears.

Linking a literal of an op node back to the number's node by its value
linked a constant of the same value too: ``x.select(1, k)`` captured when
``k == 1`` replayed ``select(x, k, k)``, ``x.clamp(0.0, hi)`` captured with
``hi == 0.0`` replayed ``clamp(x, hi, hi)``, and a random ``rot90`` raised on
a later call. Each step below meets that coincidence on its capture call and
is compared with eager after every call. A number that reaches an op torch
computes other sizes from (``narrow`` recorded as ``slice``) refuses.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof


class _Rotate(nn.Module):
    """Picks a slice with a pointer it keeps in a buffer and reads with ``.item()`` (a queue's pointer)."""

    def __init__(self, start: int = 0) -> None:
        super().__init__()
        # Call 1 is the capture call (call 0 runs as it is): from 0, the pointer is 1 there, select's dim.
        self.register_buffer("ptr", torch.tensor(start))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.ptr.item()
        self.ptr.add_(1).remainder_(3)
        return x.select(1, k)


def _compare(make: Callable[[], Callable[..., torch.Tensor]], calls: list[tuple[Any, ...]]) -> tuple[Any, list[str]]:
    eager, traced = make(), graphprof.trace(make())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, args in enumerate(calls):
            torch.manual_seed(i)
            expected = eager(*args)
            torch.manual_seed(i)
            assert torch.equal(traced(*args), expected), f"call {i}"
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def test_an_item_index_equal_to_the_dim_is_linked_as_the_index() -> None:
    x = torch.arange(27.0).reshape(3, 3, 3)

    def make() -> Callable[..., torch.Tensor]:
        rotate = _Rotate()
        return lambda t: rotate(t)

    traced, messages = _compare(make, [(x,)] * 6)
    assert traced.capture_mode == "whole-step" and messages == []


def test_a_bound_equal_to_the_other_bound_is_linked_as_itself() -> None:
    x = torch.linspace(-2, 6, 5)

    def make() -> Callable[..., torch.Tensor]:
        return lambda t, hi: t.clamp(0.0, hi)

    traced, messages = _compare(make, [(x, 3.0), (x, 0.0), (x, 5.0), (x, 2.0)])  # captured with hi == 0.0
    assert traced.capture_mode == "whole-step" and messages == []


@pytest.mark.parametrize("op", ["rot90", "roll"])
def test_a_drawn_rotation_replays_every_draw(op: str) -> None:
    """RotNet's step: ``k = torch.randint(0, 4, ()).item()`` rotates the batch and labels it ``k``."""
    def make() -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor) -> torch.Tensor:
            k = torch.randint(0, 4, ()).item()
            turned = torch.rot90(x, k, (1, 2)) if op == "rot90" else torch.roll(x, k, 1)
            return turned + torch.full((x.shape[0],), k).view(-1, 1, 1)
        return step

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(2, 4, 4)
    _, messages = _compare(make, [(x,)] * 8)
    assert len(messages) <= 1, messages


def test_an_item_start_of_narrow_refuses_rather_than_keep_the_end_torch_computed() -> None:
    """``x.narrow(1, k, 1)`` is recorded as ``slice(x, 1, k, k + 1)``, the end computed by torch from the
    capture call's ``k``: replays took ``k..3`` where eager took ``k..k+1``. Now the capture refuses."""
    def make() -> Callable[..., torch.Tensor]:
        rotate = _Rotate(start=1)  # 2 on the capture call: no other 2 in narrow's numbers
        return lambda t: t.narrow(1, rotate.ptr.item(), 1) * 2 + rotate.ptr.add_(1).remainder_(3)

    x = torch.arange(12.0).reshape(2, 6)
    traced, messages = _compare(make, [(x,)] * 6)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "reaches narrow as a size or an index" in messages[0], messages
