"""Values a step reads after its own scheduler step: never decided on the value the call started with.

A replay's guards are checked before it runs. A rate, or a scheduler's own
count, read after ``sched.step()`` in the same step is only known once the
replay has made that step: a check on it saw the call's starting value, and
on the call where the schedule crossed a threshold the replay took the other
branch than eager, silently. Such a branch now refuses (segments, one
warning), while the same values logged, or read before the scheduler step,
or read from an optimizer no scheduler of the step has touched yet, stay in
one replayed graph. A scheduler's own fields (``last_epoch``) were baked into
the graph as the capture call's number; they are inputs now.

Each scenario runs the same loop eagerly and traced and compares, after
every call, the printed text, the logged values, the parameters, the
groups' rates and the schedulers' state.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 6


class _Loop:
    """Two models, two optimizers, two step schedulers (halving every two steps from 0.1)."""

    def __init__(self, body: Callable[["_Loop", torch.Tensor], None], cycle: bool = False,
                 lambda_lr: bool = False) -> None:
        torch.manual_seed(0)
        self.warmup = 2.0
        self.model, self.other = nn.Linear(4, 2), nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        self.opt2 = torch.optim.SGD(self.other.parameters(), lr=0.1)
        self.sched: Any = (torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=0.2, total_steps=50) if cycle
                           else torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5))
        if lambda_lr:  # a decay scaled by the trainer's own setting
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda e: 0.5 ** (e // 2) / self.warmup)
        self.sched2 = torch.optim.lr_scheduler.StepLR(self.opt2, step_size=2, gamma=0.5)
        self.logged: list[Any] = []
        self.body = body

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.body(self, loss)
        return loss.detach()

    def state(self) -> tuple[Any, ...]:
        return (self.logged, [p.clone() for p in (*self.model.parameters(), *self.other.parameters())],
                [g["lr"] for o in (self.opt, self.opt2) for g in o.param_groups],
                self.sched.state_dict(), self.sched2.state_dict())


def _run(body: Callable[[_Loop, torch.Tensor], None], **loop: bool) -> tuple[Any, list[str], list[str]]:
    """Eager and traced side by side; the traced step, graphprof's warnings and the printed lines."""
    eager, copy = _Loop(body, **loop), _Loop(body, **loop)
    traced = graphprof.trace(copy.step)
    messages, lines = [], []
    for i in range(CALLS):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        printed = []
        for fn in (eager.step, traced):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn(x)
            printed.append(out.getvalue())
            messages += [str(w.message) for w in caught if "graphprof" in str(w.message)]
        assert printed[0] == printed[1], f"printed text differs on call {i}"
        lines.append(printed[1])
        for a, b in zip(eager.state(), copy.state()):
            if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
                assert all(torch.equal(p, q) for p, q in zip(a, b)), f"parameters differ after call {i}"
            else:
                assert a == b, f"state differs after call {i}"
    return traced, messages, lines


def _stepped(loop: _Loop) -> None:
    loop.opt.step()
    loop.sched.step()


def _branch(value: Callable[[_Loop], Any], threshold: float) -> Callable[[_Loop, torch.Tensor], None]:
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        print("low" if value(loop) < threshold else "high")
    return body


@pytest.mark.parametrize(("value", "threshold", "named"), [
    (lambda loop: loop.sched.get_last_lr()[0], 0.04, "StepLR.last_lr[0], read after StepLR.step"),
    (lambda loop: loop.opt.param_groups[0]["lr"], 0.04, "SGD.param_groups[0].lr, read after StepLR.step"),
    (lambda loop: loop.sched.last_epoch % 2, 1, "StepLR.last_epoch, read after StepLR.step"),
], ids=["get_last_lr", "param_groups", "last_epoch"])
def test_a_branch_on_a_value_the_scheduler_step_changed_refuses(value: Callable[[_Loop], Any], threshold: float,
                                                               named: str) -> None:
    traced, messages, lines = _run(_branch(value, threshold))
    assert len(set(lines)) == 2  # both branches were taken, on eager's calls
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and named in messages[0] and "cannot know before it runs" in messages[0], messages


def test_a_branch_on_a_tensor_made_from_a_rate_the_scheduler_changed_refuses() -> None:
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        rates = torch.full((2,), 1.0) * loop.sched.get_last_lr()[0]
        print("low" if bool((rates < 0.04).all()) else "high")

    traced, messages, lines = _run(body)
    assert len(set(lines)) == 2
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "depends on StepLR.last_lr[0], read after StepLR.step" in messages[0], messages


def test_a_scheduler_count_read_before_its_step_is_a_guard_on_an_input() -> None:
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        print("even" if loop.sched.last_epoch % 2 == 0 else "odd")
        _stepped(loop)

    traced, messages, lines = _run(body)
    assert lines == ["even\n", "odd\n"] * (CALLS // 2)  # the capture call's count was baked in before
    assert traced.capture_mode == "whole-step" and traced.captures == 2 and not messages


def test_values_read_after_the_scheduler_step_are_logged_by_the_replay() -> None:
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        loop.logged.append((loop.sched.last_epoch, loop.sched.get_last_lr()[0], loop.opt.param_groups[0]["lr"]))

    traced, messages, _ = _run(body)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_another_optimizers_rates_stay_inputs_after_a_scheduler_step() -> None:
    """A GAN's second optimizer steps after the first one's scheduler: its reads are not late."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        loop.opt2.zero_grad()
        loop.other(torch.ones(1, 4)).sum().backward()
        loop.opt2.step()
        print("low" if loop.opt2.param_groups[0]["lr"] < 0.04 else "high")
        loop.sched2.step()

    traced, messages, lines = _run(body)
    assert len(set(lines)) == 2
    assert traced.capture_mode == "whole-step" and not messages


def test_a_scheduler_stepped_before_the_optimizer_keeps_the_step_whole() -> None:
    """StepLR writes only ``lr``, on which SGD takes no guard: its ``momentum != 0`` check stays."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        loop.sched.step()
        loop.opt.step()

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step()` before")
        traced, messages, _ = _run(body)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_cycled_momentum_read_by_the_optimizer_after_the_scheduler_refuses() -> None:
    """OneCycleLR writes SGD's ``momentum`` too: the optimizer's guard on it cannot be checked first."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        loop.sched.step()
        loop.opt.step()

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step()` before")
        traced, messages, _ = _run(body, cycle=True)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "momentum, read after OneCycleLR.step" in messages[0], messages


def test_a_write_to_a_schedulers_field_refuses() -> None:
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        loop.opt.step()
        loop.sched.last_epoch = loop.sched.last_epoch + 0
        loop.sched.step()

    traced, messages, _ = _run(body)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "the step changes StepLR.last_epoch" in messages[0], messages


def test_a_scheduler_lambda_reading_the_steps_own_setting_steps_on_its_real_number() -> None:
    """The lambda ran on the capture's traced ``self.warmup``: a traced rate stayed in the user's groups."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        loop.logged.append(loop.opt.param_groups[0]["lr"])

    traced, messages, _ = _run(body, lambda_lr=True)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_scheduler_lambda_reading_a_setting_the_step_changed_refuses() -> None:
    """The replay's scheduler would run before the replay writes ``self.warmup`` back at its end."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        loop.warmup = loop.warmup + 1.0
        _stepped(loop)

    traced, messages, _ = _run(body, lambda_lr=True)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "LambdaLR.step at" in messages[0] and "the step changed before it" in messages[0]



class _KeptLoop(_Loop):
    """The scheduler kept in a dict or a tuple, not in an attribute of its own."""

    def __init__(self, body: Callable[[_Loop, torch.Tensor], None], kept: str) -> None:
        super().__init__(body)
        sched = self.__dict__.pop("sched")
        self.kept: Any = {"sched": sched} if kept == "dict" else (sched,)

    @property  # type: ignore[override]
    def sched(self) -> Any:
        return self.kept["sched"] if isinstance(self.kept, dict) else self.kept[0]

    @sched.setter
    def sched(self, value: Any) -> None:
        self.__dict__["sched"] = value


@pytest.mark.parametrize("kept", ["dict", "tuple"])
def test_a_refused_capture_puts_back_a_scheduler_the_step_reaches_through_a_container(kept: str) -> None:
    """A scheduler in ``state["sched"]`` (or a tuple) was not put back when a capture was refused after
    its step: the step then ran again as segments and the scheduler stepped twice."""
    def body(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        sys.stdout.write(f"loss {loss.item():.4f}\n")  # refuses the capture after the scheduler stepped

    eager, copy = _KeptLoop(body, kept), _KeptLoop(body, kept)
    traced = graphprof.trace(copy.step)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            eager.step(x)
            traced(x)
            assert eager.sched.state_dict() == copy.sched.state_dict(), f"scheduler differs after call {i}"
            assert eager.opt.param_groups[0]["lr"] == copy.opt.param_groups[0]["lr"]
    assert traced.capture_mode == "segments"
    assert len([w for w in caught if "graphprof" in str(w.message)]) == 1


def test_the_count_of_a_scheduler_kept_in_a_tuple_is_read_after_its_step() -> None:
    """A scheduler the watch does not reach is watched from its first step on: its count, logged
    after the step, is read by the replay; a branch on it refuses."""
    def logged(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        loop.logged.append(loop.sched.last_epoch)

    def branch(loop: _Loop, loss: torch.Tensor) -> None:
        _stepped(loop)
        print("even" if loop.sched.last_epoch % 2 == 0 else "odd")

    for body, mode in ((logged, "whole-step"), (branch, "segments")):
        eager, copy = _KeptLoop(body, "tuple"), _KeptLoop(body, "tuple")
        traced = graphprof.trace(copy.step)
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            printed = []
            for fn in (eager.step, traced):
                with contextlib.redirect_stdout(io.StringIO()) as out, warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fn(x)
                printed.append(out.getvalue())
            assert printed[0] == printed[1] and eager.logged == copy.logged, f"call {i}"
        assert traced.capture_mode == mode
