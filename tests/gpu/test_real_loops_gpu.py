"""Real training loops on an accelerator: scheduler inside the step and an accumulation counter.

The same comparison as tests/test_real_loops.py, with model and data on the
device: the replay runs the same kernels as eager, so results are equal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

import graphprof
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR


def _setup(accumulate: bool):
    device = accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    box = {"micro": 0}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not accumulate:
            opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        box["micro"] += 1
        if not accumulate or box["micro"] % 3 == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if accumulate:
                opt.zero_grad()
        return loss

    def batch(i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, 64, generator=g).to(device), torch.randn(16, 8, generator=g).to(device)

    return model, opt, sched, box, step, batch


@pytest.mark.parametrize("accumulate", [False, True], ids=["sched-inside", "accumulation"])
def test_real_loop_on_device_equals_eager(accumulate: bool) -> None:
    ma, oa, sa, ba, step_a, batch = _setup(accumulate)
    mb, ob, sb, bb, step_b, _ = _setup(accumulate)
    fn = graphprof.trace(step_b, profiling=True)
    for i in range(10):
        la, lb = step_a(*batch(i)), fn(*batch(i))
        assert torch.equal(la, lb), f"loss of call {i} differs"
        for p, q in zip(ma.parameters(), mb.parameters()):
            assert torch.equal(p, q), f"parameters differ after call {i}"
        assert sa.last_epoch == sb.last_epoch and sa.get_last_lr() == sb.get_last_lr()
        assert ba == bb
    assert fn.capture_mode == "whole-step"
    assert fn.get_profile().steps


def _host_batches_loop():
    """A loader's CPU batches moved inside the step (pinned, non-blocking) and a running loss read back."""
    device = accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    meter = {"sum": 0.0, "count": 0}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        meter["sum"] += loss.item() * x.shape[0]
        meter["count"] += x.shape[0]
        return loss.detach()

    return model, meter, step


def test_host_batches_moved_inside_the_step_and_a_running_loss_equal_eager() -> None:
    ma, meter_a, step_a = _host_batches_loop()
    mb, meter_b, step_b = _host_batches_loop()
    fn = graphprof.trace(step_b, profiling=True)
    for i in range(8):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(16, 64, generator=g).pin_memory(), torch.randn(16, 8, generator=g).pin_memory()
        assert torch.equal(step_a(x, y), fn(x, y)), f"loss of call {i} differs"
        assert meter_a == meter_b, f"meter differs after call {i}"
        assert all(torch.equal(p, q) for p, q in zip(ma.parameters(), mb.parameters())), f"call {i}"
    assert fn.capture_mode == "whole-step"
