"""Sparse gradients (``nn.Embedding(sparse=True)`` with ``SparseAdam``) are not replayed as a graph.

A replayed SparseAdam step left eager's results from its first replay on,
in whole-step and segmented capture alike; the step now runs the optimizer
eagerly, with a warning, and every call equals eager's.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof


def _make() -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SparseAdam(model.parameters(), lr=0.1)

    def step(idx: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(idx).pow(2).sum()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_sparse_gradients_give_eagers_results(capture: str) -> None:
    (eager_model, eager), (model, step) = _make(), _make()
    traced: Any = graphprof.trace(step, capture=capture)
    messages: list[str] = []
    for i in range(5):
        idx = torch.randint(0, 10, (4, 3), generator=torch.Generator().manual_seed(i))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(idx), traced(idx)), f"loss differs on call {i}"
        messages += [str(w.message) for w in caught]
        assert torch.equal(eager_model.weight, model.weight), f"weights differ after call {i}"
    assert traced.capture_mode == "segments"
    assert any("sparse_coo gradients" in m for m in messages)
