"""State kept on a class the step names: ``Trainer.calls += 1``, ``Log.losses.append(...)``.

A class was not watched, so what the step kept on it ran only in the capture
call: a counter stayed at that call's value in every replay, silently, and a
log kept the capture call's ``TracedScalar``. The public data attributes of a
class defined in the user's code that the step names are now watched like an
object's fields: numbers are read at run time and written back, lists and
dicts are held and their appends replayed.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6


class Trainer:
    """A class used as a namespace of training state."""

    calls = 0
    seen_total = 0.0
    mode = "train"

    def describe(self) -> str:  # a method: not state
        return self.mode


class Log:
    losses: list[float] = []


def _reset() -> None:
    Trainer.calls, Trainer.seen_total = 0, 0.0
    Log.losses = []


def _run(traced: bool) -> tuple[list[Any], Any]:
    _reset()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        Trainer.calls += 1
        Trainer.seen_total += loss.item()
        Log.losses.append(loss.item())
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    observed = []
    for i in range(CALLS):
        g = torch.Generator().manual_seed(i)
        loss = run(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g))
        observed.append((loss, Trainer.calls, Trainer.seen_total, list(Log.losses),
                         [p.detach().clone() for p in model.parameters()]))
    return observed, run


def test_a_counter_and_a_log_kept_on_a_class_change_on_every_replay_as_in_eager() -> None:
    eager, _ = _run(False)  # one after the other: the class is shared
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal
        traced, run = _run(True)
    for i, (a, b) in enumerate(zip(eager, traced)):
        assert torch.equal(a[0], b[0]) and a[1:4] == b[1:4], f"call {i}: {a[1:4]} vs {b[1:4]}"
        assert all(type(v) is float for v in b[3]), f"call {i}: the log holds {b[3]}"
        assert all(torch.equal(p, q) for p, q in zip(a[4], b[4])), f"call {i}"
    assert run.capture_mode == "whole-step" and run.captures == 1
    assert Trainer.describe is vars(Trainer)["describe"]  # methods are left alone
