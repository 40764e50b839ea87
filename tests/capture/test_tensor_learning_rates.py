"""A learning rate given as a tensor (``Adam(params, lr=torch.tensor(1e-2))``) replays one graph.

The fused kernels take the rate as a tensor, and torch's schedulers write
it in place (``fill_``). graphprof did not know the group's tensor as the
optimizer's state, so the graph would have held it as the capture call's
constant: the capture was refused and the step ran as segments. It is now
state the graph reads where the group keeps it; a group given another
tensor captures again (capture/baked_values.py bakes the rate by identity).
The per-parameter Adam, AdamW and SGD pass the rate (divided by the bias
correction) as a tensor where the op takes a number, which torch's argument
parsing reads on the host: that read is replayed (capture/parsed_numbers.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_same_optimizer_loop, optimizer_loop

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adam": lambda p: torch.optim.Adam(p, lr=torch.tensor(1e-2)),
    "adamw": lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), weight_decay=0.05),
    "sgd": lambda p: torch.optim.SGD(p, lr=torch.tensor(1e-2), momentum=0.9),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=torch.tensor(1e-2), fused=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), weight_decay=0.05, fused=True),
    "sgd-fused": lambda p: torch.optim.SGD(p, lr=torch.tensor(1e-2), momentum=0.9, fused=True),
}


def _scheduled_loop(make_optimizer: Callable[[Any], torch.optim.Optimizer], traced: bool,
                    calls: int = 8) -> tuple[list[Any], Any]:
    """A model trained with ``make_optimizer`` and a cosine one-cycle schedule stepped in the step:
    per call the loss, the rate and the parameters after it, and the traced function."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    g = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(calls):
        loss = run(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g))
        seen.append((loss, opt.param_groups[0]["lr"].clone(), [p.detach().clone() for p in model.parameters()],
                     sched.state_dict()["last_epoch"]))
    return seen, run


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_scheduled_tensor_learning_rate_replays_one_graph(name: str) -> None:
    """The schedule writes the rate in place after every update: each replay's update reads the rate the
    scheduler left, bitwise as eager, and the step replays its second call's graph."""
    expected, _ = _scheduled_loop(OPTIMIZERS[name], traced=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, traced = _scheduled_loop(OPTIMIZERS[name], traced=True)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    for i, (a, b) in enumerate(zip(expected, got)):
        assert _equal(a, b), f"after call {i}"
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_a_tensor_learning_rate_replaced_between_calls_captures_again() -> None:
    """A group given a new rate tensor before call 4: the graph holding the old one is not replayed; the
    next capture reads the new one, and every call stays equal to eager."""
    def replace(i: int, opt: torch.optim.Optimizer) -> None:
        if i == 4:
            opt.param_groups[0]["lr"] = torch.tensor(3e-3)

    make = OPTIMIZERS["adam-fused"]
    expected, _ = optimizer_loop(make, traced=False, between=replace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, traced = optimizer_loop(make, traced=True, between=replace, profiling=True)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert_same_optimizer_loop(expected, got)
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2
