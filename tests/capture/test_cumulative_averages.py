"""Batch norm with ``momentum=None`` (a cumulative moving average) replays one graph
(capture/cumulative_averages.py).

torch's ``_BatchNorm.forward`` counts the batches in ``num_batches_tracked``
and passes ``1.0 / float(num_batches_tracked)`` as the momentum of the
running statistics' update: a number that changes on every call. It used to
refuse the whole-step capture (``float()`` of the model's state), so the
step ran as segments with a warning. The replay now reads the count after
its own increment and hands batch norm the same double eager computes.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.host_reads import install, uninstall
from tests.helpers import assert_bitwise_against_eager


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=None), nn.ReLU(), nn.Linear(16, 4))


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.BatchNorm2d(6, momentum=None)
        self.head = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.norm(self.conv(x))).mean((2, 3)))


def _trained(build: Callable[[], nn.Module], adam: bool) -> Callable[[], tuple[nn.Module, Any]]:
    def make() -> tuple[nn.Module, Any]:
        model = build()
        opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if adam
               else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


def _inputs(shape: tuple[int, ...]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(*shape, generator=g), torch.randn(shape[0], 4, generator=g)
    return inputs


@pytest.mark.parametrize("build, shape, adam", [(_mlp, (4, 8), False), (_ConvNet, (4, 3, 5, 5), True)],
                         ids=["batchnorm1d-sgd", "batchnorm2d-adam"])
def test_a_cumulative_batch_norm_replays_one_graph(build: Callable[[], nn.Module], shape: tuple[int, ...],
                                                   adam: bool) -> None:
    """Every call's running statistics, counts, parameters and losses equal eager's bitwise, and the
    step replays the graph of its second call (the first runs eagerly), without a warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_trained(build, adam), _inputs(shape), calls=7, profiling=True)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_train_and_eval_calls_of_a_cumulative_batch_norm_stay_equal() -> None:
    """An evaluation every third call (running statistics read, not updated, count unchanged) between
    training calls: each mode replays its own graph and the counts go on as in eager."""
    def make() -> tuple[nn.Module, Any]:
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def step(x: torch.Tensor, y: torch.Tensor, train: bool) -> torch.Tensor:
            model.train(train)
            if not train:
                with torch.no_grad():
                    return F.mse_loss(model(x), y)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        return (*_inputs((4, 8))(i), i % 3 != 2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, inputs, calls=9, profiling=True)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"


def test_a_cumulative_batch_norm_replays_while_a_segmented_step_times_host_reads() -> None:
    """A profiled step elsewhere that runs as segments wraps ``Tensor.__float__`` to time its reads: the
    factor's read is still told from batch norm's own forward, through the wrapper."""
    install()
    try:
        test_a_cumulative_batch_norm_replays_one_graph(_mlp, (4, 8), False)
    finally:
        uninstall()


def test_a_scaled_step_whose_gradients_overflow_puts_the_count_back() -> None:
    """Under a gradient scaler the count and running statistics are written in the forward, before the
    overflow check; a replay that stops there puts them back, and eager's run of the call (step skipped)
    counts that batch once, as eager does."""
    def make() -> tuple[nn.Module, Any]:
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach(), scaler.get_scale() * torch.ones(())
        return model, step

    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = _inputs((4, 8))(i)
        if i in (3, 4):
            y[0, 0] = float("inf")  # the loss overflows; batch norm sees a finite batch
        return x, y

    torch.manual_seed(0)
    eager_model, eager_step = make()
    torch.manual_seed(0)
    model, step = make()
    traced = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(8):
            expected, got = eager_step(*inputs(i)), traced(*inputs(i))
            for a, b in [*zip(expected, got), *zip(eager_model.state_dict().values(), model.state_dict().values()),
                         *((p.grad, q.grad) for p, q in zip(eager_model.parameters(), model.parameters()))]:
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"after call {i}")
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1
    assert model[1].num_batches_tracked.item() == 8
