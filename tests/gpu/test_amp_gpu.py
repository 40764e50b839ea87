"""Mixed precision on an accelerator: autocast, and a gradient scaler that skips steps.

The usual GPU training loop runs the forward under ``torch.autocast`` and, in
float16, scales the loss with ``torch.amp.GradScaler``, whose ``step`` skips
the optimizer when a gradient overflowed (a branch on ``found_inf.item()``:
the graph holds the path that steps and a check that stops a replay whose
gradients overflowed before it changes anything; that call runs eagerly,
capture/grad_scaler.py). Both must leave exactly what eager leaves:
parameters, the scaler's scale and growth tracker, the losses.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_bitwise_against_eager
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN where the other is NaN (an overflowed step leaves NaN gradients on both sides)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def test_a_bfloat16_autocast_step_on_the_device_is_one_graph_equal_to_eager() -> None:
    def make() -> tuple[nn.Module, Any]:
        model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    traced = assert_bitwise_against_eager(make, _batch, 6, device=accelerator(), profiling=True)
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def _scaled_loop(optimizer: str) -> tuple[nn.Module, torch.amp.GradScaler, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1)).to(accelerator())
    opt: torch.optim.Optimizer = (torch.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam"
                                  else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    # A scale of 2**20 overflows float16 gradients: the first calls skip the optimizer and halve it.
    scaler = torch.amp.GradScaler(accelerator().type, init_scale=2.0**20, growth_interval=2)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast(x.device.type, dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.detach()
    return model, scaler, step


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_gradient_scaler_skipping_overflowed_steps_leaves_what_eager_leaves(optimizer: str) -> None:
    model_a, scaler_a, step_a = _scaled_loop(optimizer)
    model_b, scaler_b, step_b = _scaled_loop(optimizer)
    traced = graphprof.trace(step_b, profiling=True)
    messages: list[str] = []
    for i in range(16):  # the first calls overflow (one per halving of the scale) and run eagerly
        x, y = (t.to(accelerator()) for t in _batch(i))
        expected = step_a(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught if "graphprof" in str(w.message)]
        where = f"after call {i}"
        assert _same(expected, got), f"loss differs {where}"
        for p, q in zip(model_a.parameters(), model_b.parameters()):
            assert _same(p, q) and _same(p.grad, q.grad), f"parameters or gradients differ {where}"
        assert scaler_a.state_dict() == scaler_b.state_dict(), f"scaler differs {where}"
    assert scaler_a.get_scale() < 2.0**20  # steps were skipped, as the test means
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1
