"""A step that multiplies by a sparse COO matrix replays whole-step, profiled, as eager computes it.

Graph convolution (Kipf's pygcn: ``torch.spmm(adj, support)``) holds a
normalised sparse adjacency: in its closure, as an argument of the model's
forward (``torch.sparse.mm``), or as a registered buffer. The capture call
measures kernel workspace on copies of every tensor the graph holds
(runtime/workspace.py), and the memory pass counts the storages of its state
(passes/memory.py); a sparse tensor has neither strides nor a storage of its
own, and asking for one raised into the step's first five calls (or refused
the buffer's capture). Each form is run beside an eager twin from the same
seed: the returned losses, parameters, gradients and optimizer state are
bitwise equal after every call, and no warning is given.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.profile.model import Profile

NODES, FEATURES, CLASSES, CALLS = 8, 5, 3, 6


class GCN(nn.Module):
    """One graph convolution: ``adj @ (x @ w)``, the adjacency as pygcn holds it or as a buffer."""

    def __init__(self, form: str, adj: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(FEATURES, CLASSES) * 0.1)
        self.form = form
        if form == "buffer":
            self.register_buffer("adj", adj)

    def forward(self, x: torch.Tensor, adj: torch.Tensor | None = None) -> torch.Tensor:
        support = x @ self.weight
        return torch.sparse.mm(self.adj if adj is None else adj, support)


def _adjacency() -> torch.Tensor:
    """A row-normalised adjacency with self loops, as pygcn's ``normalize(adj + eye)``."""
    dense = (torch.rand(NODES, NODES) > 0.6).float() + torch.eye(NODES)
    return (dense / dense.sum(1, keepdim=True)).to_sparse()


def _setup(form: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], nn.Module,
                                torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    torch.manual_seed(0)
    adj = _adjacency()
    model = GCN(form, adj)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    batches = [(torch.randn(NODES, FEATURES), torch.randint(0, CLASSES, (NODES,))) for _ in range(CALLS)]

    def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if form == "closure":
            out = torch.spmm(adj, x @ model.weight)
        elif form == "argument":
            out = model(x, adj)
        else:
            out = model(x)
        loss = F.cross_entropy(out, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return step, model, opt, batches, adj


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> list[Any]:
    """Every tensor and number the user can read after a call: parameters, gradients, optimizer state."""
    out: list[Any] = []
    for p in model.parameters():
        out += [p.detach(), p.grad]
        out += [v for _, v in sorted(opt.state[p].items())]
    return out


def _assert_equal(a: list[Any], b: list[Any], where: str) -> None:
    assert len(a) == len(b), where
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), where
        else:
            assert x == y, where


def _run_twins(form: str) -> tuple[Any, torch.Tensor]:
    """The eager and the traced twin side by side, compared after every call; the traced function."""
    eager_step, eager_model, eager_opt, batches, _ = _setup(form)
    step, model, opt, _, adj = _setup(form)
    traced = graphprof.trace(profiling=True)(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call, (x, labels) in enumerate(batches):
            expected = eager_step(x, labels)
            got = traced(x, labels)
            assert torch.equal(expected, got), f"{form}: call {call}'s loss"
            _assert_equal(_state(eager_model, eager_opt), _state(model, opt), f"{form}: after call {call}")
    assert [str(w.message) for w in caught] == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    return traced, adj


@pytest.mark.parametrize("form", ["closure", "argument", "buffer"])
def test_a_sparse_adjacency_replays_whole_step_with_results_equal_to_eager(form: str) -> None:
    traced, _ = _run_twins(form)
    profile: Profile = traced.get_profile()
    assert len(profile.steps) == CALLS - 2
    assert profile.meta.extra["workspace"] == "measured"
