"""A batch passed as an object torch's flattening does not open.

A ``UserDict`` (a tokenizer's ``BatchEncoding``) and a dataclass are opened
like dicts (capture/batches.py): their tensors are inputs, and the step
replays whole-step. A plain object holding tensors stays one opaque value,
told apart by identity: the graph would hold its tensors as the capture
call's, so such a capture is refused. A loop that refilled the same batch
object replayed the first batch's tensors, silently; one that made a new
object per call captured on every call until the storm limit.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


class _Batch(collections.UserDict):  # what a tokenizer's BatchEncoding is
    pass


@dataclasses.dataclass
class _Pair:
    x: torch.Tensor
    y: torch.Tensor


def _make() -> tuple[nn.Module, Callable[[Any], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch: Any) -> torch.Tensor:
        x, y = (batch["x"], batch["y"]) if isinstance(batch, collections.UserDict) else (batch.x, batch.y)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def _refill(batch: _Batch, x: torch.Tensor, y: torch.Tensor) -> _Batch:
    batch["x"], batch["y"] = x, y
    return batch


class _Plain:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


@pytest.mark.parametrize("kind", ["the same UserDict refilled", "a new dataclass per call", "a plain object"])
def test_tensors_inside_an_argument_object_are_never_replayed_as_constants(kind: str) -> None:
    (eager_model, eager), (model, step) = _make(), _make()
    traced = graphprof.trace(step)
    kept_eager, kept = _Batch(), _Batch()
    messages: list[str] = []
    for i in range(5):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        if kind.startswith("the same"):
            a, b = _refill(kept_eager, x, y), _refill(kept, x.clone(), y.clone())
        elif kind.endswith("per call"):
            a, b = _Pair(x, y), _Pair(x.clone(), y.clone())
        else:
            a, b = _Plain(x, y), _Plain(x.clone(), y.clone())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(a), traced(b)), f"loss differs on call {i}"
        messages += [str(w.message) for w in caught]
        assert torch.equal(eager_model.weight, model.weight), f"weights differ after call {i}"
    if kind == "a plain object":
        assert traced.capture_mode == "segments"
        assert len(messages) == 1 and "argument 0 (flattened)" in messages[0]
    else:  # opened like a dict: one graph, the batch's tensors its inputs
        assert traced.capture_mode == "whole-step" and traced.captures == 1 and messages == []


def test_an_optimizer_passed_as_an_argument_still_replays_whole_step() -> None:
    """Its tensors are model state, read where they live: not a reason to refuse."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)

    def step(opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    traced = graphprof.trace(step)
    for _ in range(4):
        traced(opt, torch.randn(4, 8), torch.randn(4, 1))
    assert traced.capture_mode == "whole-step" and traced.captures == 1
