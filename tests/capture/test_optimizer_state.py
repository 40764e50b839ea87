"""An optimizer whose state is loaded between calls (a resumed run, a restored checkpoint).

``opt.load_state_dict(...)`` puts new tensors in a new ``state`` dict. The
graph held the old tensors, so every replay after it went on updating the
moments the user had thrown away, silently.
"""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


def _make(kind: str) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt: torch.optim.Optimizer = (torch.optim.Adam(model.parameters(), lr=0.01) if kind == "adam"
                                  else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, opt, step


@pytest.mark.parametrize("kind", ["adam", "sgd momentum"])
def test_loading_the_optimizer_s_state_between_calls_is_replayed_from_the_loaded_state(kind: str) -> None:
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(9)]
    results = []
    for traced in (False, True):
        model, opt, step = _make(kind)
        run = graphprof.trace(step) if traced else step
        saved = None
        for i, (x, y) in enumerate(batches):
            if i == 3:
                saved = copy.deepcopy(opt.state_dict())
            if i == 6:
                opt.load_state_dict(saved)  # back to the moments after call 2
            run(x, y)
        results.append(([p.detach().clone() for p in model.parameters()], copy.deepcopy(opt.state_dict())))
        if traced:
            assert run.capture_mode == "whole-step" and run.captures == 2
    (eager_params, eager_opt), (params, traced_opt) = results
    assert all(torch.equal(a, b) for a, b in zip(eager_params, params))
    for p, state in eager_opt["state"].items():
        assert all(torch.equal(v, traced_opt["state"][p][k]) for k, v in state.items())
