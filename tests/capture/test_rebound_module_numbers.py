"""A number a module keeps (or a helper object it holds) that the step reads and rebinds for the next call.

BYOL's in-place EMA reads ``learner.target_ema_updater.beta`` and then sets
the next call's value from its cosine schedule; a Gumbel quantizer's
temperature is annealed at the end of every step. A module's numbers are
configuration, baked into the graph where the step reads them: the capture
call's value was replayed on every later call while the attribute itself
was updated, so the EMA weights drifted from eager with no warning. Each
scenario runs an eager and a traced copy from one seed and compares every
parameter, buffer, result and the kept number after every call.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


class _Decay:
    """A plain helper a module keeps (BYOL's ``EMA(beta)``)."""

    def __init__(self, beta: float | int) -> None:
        self.beta = beta


class _Learner(nn.Module):
    """An online network and its EMA target; the decay lives on the module itself or on a helper."""

    def __init__(self, initial: float | int) -> None:
        super().__init__()
        self.online = nn.Linear(4, 4)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.beta = initial
        self.updater = _Decay(initial)
        self.sub = nn.Module()
        self.sub.beta = initial


def _holder(learner: _Learner, where: str) -> Any:
    return {"module": learner, "helper": learner.updater, "submodule": learner.sub}[where]


def _run(make: Callable[[], tuple[nn.Module, Callable[..., Any], Callable[[nn.Module], Any]]],
         calls: int = 8) -> tuple[Any, list[str]]:
    """Run both copies ``calls`` times; returns the traced step and graphprof's warnings."""
    torch.manual_seed(0)
    eager_model, eager, kept = make()
    torch.manual_seed(0)
    model, step, _ = make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            torch.manual_seed(100 + i)
            expected = eager(x)
            torch.manual_seed(100 + i)
            got = traced(x)
            where = f"after call {i}"
            assert torch.equal(expected, got), f"result differs {where}"
            assert_modules_equal(eager_model, model, where)
            assert type(kept(eager_model)) is type(kept(model)) and kept(eager_model) == kept(model), where
    return traced, [str(w.message) for w in caught if str(w.message).startswith("graphprof")]


@pytest.mark.parametrize("kind", [float, int])
@pytest.mark.parametrize("where", ["module", "helper", "submodule"])
def test_an_ema_decay_read_then_rescheduled_by_the_step(where: str, kind: type) -> None:
    """BYOL's form: ``beta = holder.beta; target.mul_(beta).add_(...)``, then ``holder.beta = tau(k)``."""

    def make() -> tuple[nn.Module, Callable[..., Any], Callable[[nn.Module], Any]]:
        learner = _Learner(kind(1) if kind is int else 0.5)
        opt = torch.optim.SGD(learner.online.parameters(), lr=0.1)
        counter = {"k": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            holder = _holder(learner, where)  # reached through the module, not kept by the step itself
            loss = F.mse_loss(learner.online(x), learner.target(x))
            opt.zero_grad()
            loss.backward()
            opt.step()
            beta = holder.beta
            with torch.no_grad():
                for t, o in zip(learner.target.parameters(), learner.online.parameters()):
                    if kind is int:
                        t.mul_(0.5).add_(o, alpha=beta)
                    else:
                        t.mul_(beta).add_(o, alpha=1 - beta)
            counter["k"] += 1
            k = counter["k"]
            holder.beta = 1 + k if kind is int else 1 - 0.5 * (math.cos(math.pi * k / 8) + 1) / 2
            return loss.detach()
        return learner, step, lambda m: _holder(m, where).beta  # type: ignore[arg-type]

    traced, warned = _run(make)
    assert not warned
    # The first capture finds the number assigned; from the second on it is an input: one graph replays.
    assert traced.capture_mode == "whole-step" and traced.captures == 2


class _GumbelQuantize(nn.Module):
    """DALL-E's quantizer: ``F.gumbel_softmax(logits, tau=self.temperature)``, annealed by the loop's step."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.embed = nn.Embedding(8, 4)
        self.temperature = 1.0

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        soft_one_hot = F.gumbel_softmax(self.proj(z), tau=self.temperature, dim=-1)
        return soft_one_hot @ self.embed.weight


def test_a_gumbel_temperature_annealed_at_the_end_of_the_step() -> None:
    """The temperature reaches a differentiable op, whose backward keeps it as a number: the graph is
    held per value, and a step whose value changes on every call may fall back, saying so."""

    def make() -> tuple[nn.Module, Callable[..., Any], Callable[[nn.Module], Any]]:
        quantizer = _GumbelQuantize()
        decoder = nn.Linear(4, 4)
        model = nn.ModuleDict({"q": quantizer, "dec": decoder})
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        counter = {"global_step": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(decoder(quantizer(x)), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            counter["global_step"] += 1
            quantizer.temperature = max(0.5, math.exp(-0.1 * counter["global_step"]))
            return loss.detach()
        return model, step, lambda m: m["q"].temperature

    traced, warned = _run(make)
    # Never silently: a replayed graph, or a warning that says the step runs another way.
    assert traced.capture_mode == "whole-step" or any("no longer capturing" in w for w in warned), warned
