"""A capture refused part way puts back the schedulers, scalers and optimizers the step drove.

The refused capture call is the user's step, run again another way: a
scheduler stepped or a scaler that unscaled the gradients before the refusal
must not count twice. Each loop runs eagerly and traced on identical copies.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.torch_objects import TorchObjects


class _Loop:
    def __init__(self, scaler: bool) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=16.0) if scaler else None
        self.big: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        if self.scaler is not None:  # its step branches on found_inf.item(): the capture is refused there
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.sched.step()
        if loss.item() > 1e6:  # a branch on a read value after the scheduler stepped: refused here
            self.big.append(loss.item())
        return loss

    def observed(self) -> Any:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return self.sched.state_dict(), [g["lr"] for g in self.opt.param_groups], scaler, self.big


@pytest.mark.parametrize("scaler", [False, True], ids=["scheduler", "grad scaler"])
def test_a_refused_capture_does_not_step_them_twice(scaler: bool) -> None:
    eager, copy = _Loop(scaler), _Loop(scaler)
    traced = graphprof.trace(copy.step)
    messages: list[str] = []
    for i in range(6):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught if "graphprof" in str(w.message)]
        assert torch.equal(expected, got), f"loss differs after call {i}"
        for a, b in zip(eager.model.parameters(), copy.model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
        assert eager.observed() == copy.observed(), f"scheduler, lr or scaler differ after call {i}"
    assert len(messages) == 1 and "segments" in messages[0]


def test_restore_puts_back_the_same_objects_with_their_items() -> None:
    model = nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.5 ** epoch)
    groups, group, lrs = opt.param_groups, opt.param_groups[0], sched._last_lr
    saved = TorchObjects([opt, sched, opt, "not torch's"])
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    sched.step()
    opt.param_groups[0]["extra"] = 1
    assert sched.last_epoch == 1 and opt.state and group["lr"] == 0.05
    saved.restore()
    assert sched.last_epoch == 0 and sched._last_lr is lrs and lrs == [0.1]
    assert opt.param_groups is groups and groups[0] is group and group["lr"] == 0.1 and "extra" not in group
    assert not opt.state  # the state the step created is gone, as before it


def test_a_failure_after_the_step_ran_is_undone_before_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while recording the captured step, after the capture call ran it: undone, run once."""
    from graphprof.capture.inputs import PythonState

    def broken(self: PythonState, *args: Any) -> tuple:
        raise RuntimeError("recording failed")

    monkeypatch.setattr(PythonState, "held", broken)
    eager, copy = _Loop(scaler=False), _Loop(scaler=False)
    copy.step = _without_branch(copy)  # type: ignore[method-assign]
    eager.step = _without_branch(eager)  # type: ignore[method-assign]
    traced = graphprof.trace(copy.step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x, y = torch.randn(6, 4), torch.randn(6, 1)
            assert torch.equal(eager.step(x, y), traced(x, y)), f"call {i}"
            assert eager.observed() == copy.observed(), f"call {i}"
    assert traced.capture_mode == "segments"
    assert any("recording failed" in str(w.message) for w in caught)


def _without_branch(loop: _Loop) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loop's step with nothing that refuses the capture: it is captured whole, then recorded."""
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loop.opt.zero_grad()
        loss = F.mse_loss(loop.model(x), y)
        loss.backward()
        loop.opt.step()
        loop.sched.step()
        return loss
    return step
