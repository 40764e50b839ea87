"""Hyperparameters the step writes into ``param_groups`` itself: replayed, or refused, never frozen.

Each scenario runs the same loop eagerly and traced and compares after
every call: the loss, the parameters and every group's hyperparameters.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


class _Loop:
    def __init__(self, write: Callable[["_Loop"], None], sched: bool = False) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5) if sched else None
        self.it = 0
        self.write = write

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.it += 1
        self.write(self)
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        return loss.detach()


def _groups(loop: _Loop) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in loop.opt.param_groups]


def _run(write: Callable[[_Loop], None], sched: bool = False, calls: int = 7) -> tuple[Any, list[str]]:
    eager, copy = _Loop(write, sched), _Loop(write, sched)
    traced = graphprof.trace(copy.step)
    messages: list[str] = []
    for i in range(calls):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        assert torch.equal(expected, got), f"loss differs on call {i}"
        for a, b in zip(eager.model.parameters(), copy.model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
        assert _groups(eager) == _groups(copy), f"param_groups differ after call {i}"
        assert all(type(v) is type(w) for e, c in zip(_groups(eager), _groups(copy)) for v, w in zip(e.values(), c.values()))
    return traced, messages


def _warmup(loop: _Loop) -> None:
    for group in loop.opt.param_groups:
        group["lr"] = 0.01 * loop.it  # computed from a counter the step keeps: an input


def _decay(loop: _Loop) -> None:
    loop.opt.param_groups[0]["lr"] *= 0.9  # computed from the group's own number


def test_a_learning_rate_computed_from_the_steps_counter_is_written_on_every_replay() -> None:
    traced, messages = _run(_warmup)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_learning_rate_decayed_in_place_is_written_on_every_replay() -> None:
    """``g["lr"] *= 0.9`` reads the group's own number: an input read when the step starts."""
    traced, messages = _run(_decay)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_learning_rate_the_step_reads_is_the_group_s_at_each_call() -> None:
    """Logged and returned from the group, with a scheduler stepped outside the step: the capture
    call's rate was logged and returned on every replay."""
    def make() -> tuple[Callable[..., Any], torch.optim.lr_scheduler.LRScheduler, list[float]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        logged: list[float] = []

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            logged.append(opt.param_groups[0]["momentum"] * opt.param_groups[0]["lr"])
            return loss.detach(), opt.param_groups[0]["lr"]
        return step, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), logged

    (eager, eager_sched, eager_log), (step, sched, log) = make(), make()
    traced = graphprof.trace(step)
    for i in range(7):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        (a, lr_a), (b, lr_b) = eager(x, y), traced(x, y)
        assert torch.equal(a, b) and lr_a == lr_b and type(lr_b) is float, f"call {i}: {lr_a} against {lr_b}"
        eager_sched.step()
        sched.step()
    assert log == eager_log and len(set(log)) > 2
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_scheduler_stepped_in_the_step_writes_its_own_learning_rate() -> None:
    traced, messages = _run(lambda loop: None, sched=True)
    assert traced.capture_mode == "whole-step" and not messages


def test_a_write_before_a_scheduler_steps_is_still_the_steps_own() -> None:
    traced, messages = _run(_decay, sched=True)
    assert traced.capture_mode == "segments" and len(messages) == 1


class _Holder:
    """A trainer's plain object keeping its optimizers in a container (``self.optimizers = [opt]``)."""


@pytest.mark.parametrize("kept", ["list", "dict"])
def test_an_optimizer_a_plain_object_keeps_in_a_container_replays_and_keeps_its_numbers(kept: str) -> None:
    """Walked as a plain object's field, the optimizer's groups' numbers were made inputs twice: the
    capture refused with a wrong reason, every later call raised, and the groups were left holding
    graphprof's scalars in place of the user's floats."""
    results = []
    for traced in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        holder = _Holder()
        holder.optimizers = [opt] if kept == "list" else {"main": opt}  # type: ignore[attr-defined]
        key: Any = 0 if kept == "list" else "main"

        def step(x: torch.Tensor, holder: _Holder = holder, key: Any = key, model: nn.Module = model) -> torch.Tensor:
            loss = model(x).pow(2).mean()
            loss.backward()
            holder.optimizers[key].step()  # type: ignore[attr-defined]
            holder.optimizers[key].zero_grad()  # type: ignore[attr-defined]
            return loss.detach()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(4):
                loss = fn(torch.randn(3, 8, generator=torch.Generator().manual_seed(i)))
                seen.append((loss, [p.detach().clone() for p in model.parameters()],
                             {k: (type(v), v) for k, v in opt.param_groups[0].items() if k != "params"}))
        if traced:
            assert fn.capture_mode == "whole-step" and fn.captures == 1
        results.append(seen)
    for i, (e, g) in enumerate(zip(*results)):
        assert torch.equal(e[0], g[0]) and all(torch.equal(a, b) for a, b in zip(e[1], g[1])), f"call {i}"
        assert e[2] == g[2], f"call {i}"
