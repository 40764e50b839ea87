"""A number annealed per step that autograd saves for the backward replays one graph
(capture/saved_numbers.py).

DeiT's soft distillation sets ``criterion.tau`` from the step count and
divides by it (``outputs_kd / T``, then ``* (T * T)``); DALL-E's Gumbel
quantizer anneals the ``temperature`` that ``F.gumbel_softmax`` divides by.
The backward op autograd runs holds the number, so its value was guarded:
one capture per value, then segments. Linked in the backward, a replay hands
the same aten op the replay's number as autograd hands it the saved one, so
every dtype rounds as in eager (float32, bfloat16, and float16, which
computes with a number in float).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class _SoftDistillation(nn.Module):
    """DeiT's ``DistillationLoss`` (soft): its temperature is a plain attribute the loop sets."""

    def __init__(self, teacher: nn.Module) -> None:
        super().__init__()
        self.teacher = teacher
        self.tau = 1.0

    def forward(self, x: torch.Tensor, outputs: torch.Tensor, outputs_kd: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        base = F.cross_entropy(outputs.float(), labels, label_smoothing=0.1)
        with torch.no_grad():
            teacher = self.teacher(x)
        T = self.tau
        kd = F.kl_div(F.log_softmax(outputs_kd / T, dim=1), F.log_softmax(teacher / T, dim=1), reduction="sum",
                      log_target=True) * (T * T) / outputs_kd.numel()
        return base * 0.5 + kd.float() * 0.5


class _GumbelQuantize(nn.Module):
    """DALL-E's quantizer: ``F.gumbel_softmax`` at ``self.temperature``, annealed by the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 8)
        self.embed = nn.Embedding(8, 6)
        self.temperature = 1.0

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        soft_one_hot = F.gumbel_softmax(self.proj(z), tau=self.temperature, dim=-1)
        return soft_one_hot @ self.embed.weight


Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _batch(i: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 6, generator=g).to(dtype), torch.randint(0, 5, (4,), generator=g)


def _distillation(dtype: torch.dtype) -> tuple[Step, nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    model, head_kd, teacher = nn.Linear(6, 5), nn.Linear(6, 5), nn.Linear(6, 5)
    for m in (model, head_kd, teacher):
        m.to(dtype)
    criterion = _SoftDistillation(teacher)
    params = [*model.parameters(), *head_kd.parameters()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    S: dict[str, Any] = {"k": 0}

    def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        criterion.tau = 1.0 + 3.0 * S["k"] / 8
        loss = criterion(x, model(x), head_kd(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        S["k"] += 1
        return loss.detach()
    return step, nn.ModuleList([model, head_kd]), S


def _gumbel(dtype: torch.dtype) -> tuple[Step, nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    q = _GumbelQuantize().to(dtype)
    dec = nn.Linear(6, 6).to(dtype)
    model = nn.ModuleList([q, dec])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    S: dict[str, Any] = {"global_step": 0}

    def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(dec(q(x)).float(), x.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        S["global_step"] += 1
        q.temperature = max(0.5, math.exp(-0.05 * S["global_step"]))  # for the next call
        return loss.detach()
    return step, model, S


def _twins(make: Callable[[torch.dtype], Any], dtype: torch.dtype, calls: int) -> tuple[Any, list[str]]:
    """Eager and traced copies, compared bitwise after every call: results, parameters, gradients, the
    kept numbers and the RNG state (``gumbel_softmax`` draws its noise)."""
    eager_step, eager_model, eager_state = make(dtype)
    step, model, state = make(dtype)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            torch.manual_seed(100 + i)
            expected = eager_step(*_batch(i, dtype))
            rng = torch.get_rng_state()
            torch.manual_seed(100 + i)
            got = traced(*_batch(i, dtype))
            where = f"{dtype} after call {i}"
            assert torch.equal(expected, got), where
            assert torch.equal(rng, torch.get_rng_state()), where
            for p, q in zip(eager_model.parameters(), model.parameters()):
                assert torch.equal(p, q), where
                assert torch.equal(p.grad, q.grad), where
            assert eager_state == state, where
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_annealed_distillation_temperature_replays_one_graph(dtype: torch.dtype) -> None:
    """The first capture reads ``criterion.tau`` as the module's setting and sees the step assign it; the
    second reads it as a number of the step's; every later call replays that graph."""
    traced, warned = _twins(_distillation, dtype, calls=8)
    assert warned == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_annealed_gumbel_temperature_replays_one_graph(dtype: torch.dtype) -> None:
    """``F.gumbel_softmax(logits, tau=self.temperature)``: its noise is drawn by every replay, its
    division by the temperature takes the replay's number, forward and backward."""
    traced, warned = _twins(_gumbel, dtype, calls=8)
    assert warned == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2


def test_a_number_whose_backward_computes_with_it_stays_guarded() -> None:
    """``x ** tau``: autograd's formula computes ``tau - 1`` and branches on ``tau == 0`` in C++, which no
    graph shows; the number's value is guarded, one capture per value, as before."""
    def make(dtype: torch.dtype) -> tuple[Step, nn.Module, dict[str, Any]]:
        torch.manual_seed(0)
        model = nn.Linear(3, 3).to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        S: dict[str, Any] = {"tau": 1.5}

        def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = (model(x[:, :3]).abs() + 1).pow(S["tau"]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            S["tau"] += 0.25
            return loss.detach()
        return step, model, S

    traced, _ = _twins(make, torch.float32, calls=4)
    assert traced.captures == 3


def test_a_gradient_hook_holding_an_equal_constant_keeps_the_number_guarded() -> None:
    """A hook on the product's gradient (``g * 2.0``) runs in the product's backward node; at capture the
    number is 2.0 too, so the hook's op looks like the formula's. Two ops in the node: not linked, the
    number's value is guarded, and no replay multiplies the hook's gradient by the step's number."""
    def make(dtype: torch.dtype) -> tuple[Step, nn.Module, dict[str, Any]]:
        torch.manual_seed(0)
        model = nn.Linear(6, 3).to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        S: dict[str, Any] = {"T": 1.5}  # 2.0 in the capture call

        def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            y = model(x) * S["T"]
            y.register_hook(lambda g: g * 2.0)
            loss = y.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            S["T"] += 0.5
            return loss.detach()
        return step, model, S

    traced, _ = _twins(make, torch.float32, calls=4)
    assert traced.captures == 3
