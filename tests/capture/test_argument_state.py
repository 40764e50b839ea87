"""A model, an optimizer or a config given to the step as arguments (``train_step(model, opt, batch)``).

Such an argument is one leaf of the signature, told apart by identity, so
every replay gets the object its capture got. It was not part of the
step's state: a step given its model and optimizer captured on every call
(the gradients it made looked like accumulation) until it fell back to
segments, and a config namespace's fields were baked into the graph: a
counter it kept (``cfg.step += 1``) stopped counting and a changed
``cfg.scale`` was ignored, silently.
"""

from __future__ import annotations

import argparse
import types
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


class _TrainState:
    """What many loops pass around: the model, its optimizer and scheduler, a step count."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, sched: Any) -> None:
        self.model, self.opt, self.sched, self.step = model, opt, sched, 0


def _parts() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def _run(step: Callable[..., torch.Tensor], arguments: Callable[[int], tuple], calls: int,
         between: Callable[[int], None] = lambda i: None) -> tuple[list[torch.Tensor], list[str]]:
    torch.manual_seed(2)  # the same dropout masks for eager and traced
    losses, messages = [], []
    for i in range(calls):
        between(i)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses.append(step(*arguments(i)).detach().clone())
        messages += [str(w.message) for w in caught]
    return losses, messages


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _step(model: nn.Module, opt: torch.optim.Optimizer, sched: Any, x: torch.Tensor,
          y: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss


def test_a_model_optimizer_and_scheduler_given_as_arguments_replay_one_graph() -> None:
    batches = _batches(8)
    (m1, o1, s1), (m2, o2, s2) = _parts(), _parts()
    traced = graphprof.trace(_step)

    def to_eval(model: nn.Module) -> Callable[[int], None]:
        return lambda i: model.eval() if i == 5 else None  # a new graph for the other mode

    eager, _ = _run(_step, lambda i: (m1, o1, s1, *batches[i]), 8, to_eval(m1))
    replayed, messages = _run(traced, lambda i: (m2, o2, s2, *batches[i]), 8, to_eval(m2))
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 2
    assert _same(eager, replayed)
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert s1.state_dict() == s2.state_dict() and o1.param_groups[0]["lr"] == o2.param_groups[0]["lr"]
    # Ops are attributed to the argument's modules, as to a closed-over model's.
    modules = {n.module for g in traced.get_profile().graphs for n in g.nodes}
    assert {"0", "2"} <= modules


def test_an_object_holding_the_model_and_optimizer_replays_one_graph() -> None:
    batches = _batches(6)

    def step(state: _TrainState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = _step(state.model, state.opt, state.sched, x, y)
        state.step += 1
        return loss

    states = [_TrainState(*_parts()), _TrainState(*_parts())]
    traced = graphprof.trace(step)
    eager, _ = _run(step, lambda i: (states[0], *batches[i]), 6)
    replayed, messages = _run(traced, lambda i: (states[1], *batches[i]), 6)
    assert messages == [] and traced.captures == 1
    assert _same(eager, replayed)
    assert states[0].step == states[1].step == 6


@pytest.mark.parametrize("kind", [types.SimpleNamespace, argparse.Namespace])
def test_a_config_argument_s_fields_are_read_counted_and_held(kind: type) -> None:
    batches = _batches(7)

    def make() -> tuple[Callable[..., torch.Tensor], Any]:
        torch.manual_seed(0)
        model = nn.Linear(6, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor, cfg: Any) -> torch.Tensor:
            cfg.calls += 1
            d = model(x) - y
            loss = (d.abs().mean() if cfg.use_l1 else (d ** 2).mean()) * cfg.scale
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        return step, kind(calls=0, scale=1.0, use_l1=False)

    def switch(cfg: Any) -> Callable[[int], None]:
        def between(i: int) -> None:
            if i == 4:
                cfg.scale, cfg.use_l1 = 0.5, True
        return between

    (eager_step, c1), (step, c2) = make(), make()
    traced = graphprof.trace(step)
    eager, _ = _run(eager_step, lambda i: (*batches[i], c1), 7, switch(c1))
    replayed, messages = _run(traced, lambda i: (*batches[i], c2), 7, switch(c2))
    assert messages == [] and traced.capture_mode == "whole-step"
    assert _same(eager, replayed)
    assert vars(c1) == vars(c2) and c2.calls == 7
