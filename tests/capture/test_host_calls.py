"""A scheduler's step, run for real by the capture call, is undone with the rest when the capture is refused
(capture/host_calls.py, capture/snapshot.py ``HostWrites``).

The capture call runs a scheduler's ``step`` with the capture's modes off, so
the write log never saw the tensors it wrote in place: torch's
``param_group["lr"].fill_()`` of a tensor learning rate, a user scheduler's
tensor counter. A capture refused after it put back the scheduler's Python
fields but left those tensors advanced, and the step run again as segments
stepped them a second time: the next epoch's rate, silently.

Each loop runs eagerly and traced from one seed and compares, after every
call, the parameters, the groups' rates, the scheduler's state and its counter.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

import graphprof

CALLS = 5


class _TensorCount(LRScheduler):
    """Decays by 0.9 per step, counting its steps in a tensor it advances in place."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.count = torch.zeros(())
        super().__init__(opt)

    def get_lr(self) -> list[float]:
        self.count.add_(1)
        return [g["initial_lr"] * float(0.9 ** self.count) for g in self.optimizer.param_groups]


class _TensorHistory(LRScheduler):
    """Keeps a decaying history in a tensor: scaled whole, then its first item written through a view
    (the log copies the tensor and the view; put back in the wrong order, the view's later copy won)."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.count = torch.ones(3)
        super().__init__(opt)

    def get_lr(self) -> list[float]:
        self.count.mul_(0.5)
        self.count[0].add_(1)
        return [g["initial_lr"] / float(self.count[0]) for g in self.optimizer.param_groups]



class _Loop:
    def __init__(self, make_sched: Callable[[torch.optim.Optimizer], Any], tensor_lr: bool, refuse: bool) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        if tensor_lr:  # torch's "compiling the optimizer with an LR scheduler" recipe
            self.opt: torch.optim.Optimizer = torch.optim.AdamW(self.model.parameters(), lr=torch.tensor(0.01),
                                                                fused=True)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.sched = make_sched(self.opt)
        self.refuse = refuse
        self.big: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.sched.step()
        if self.refuse and loss.item() > 1e9:  # refuses the capture after the scheduler stepped
            self.big.append(loss.item())
        return loss.detach()

    def observed(self) -> Any:
        lrs = [g["lr"].item() if isinstance(g["lr"], torch.Tensor) else g["lr"] for g in self.opt.param_groups]
        count = getattr(self.sched, "count", None)
        return (lrs, self.sched.last_epoch, self.sched.get_last_lr(), None if count is None else count.tolist(),
                self.big)


_CASES: dict[str, tuple[Callable[[torch.optim.Optimizer], Any], bool, bool]] = {
    # not refused: the tensor lr is read where its group keeps it (tests/capture/test_tensor_learning_rates.py)
    "tensor lr, cosine": (lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5), True, False),
    "tensor lr, cosine, .item() branch": (lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5),
                                          True, True),
    "tensor counter, .item() branch": (_TensorCount, False, True),
    "tensor history written whole and through a view": (_TensorHistory, False, True),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_a_refused_capture_puts_back_the_tensors_a_scheduler_wrote(case: str) -> None:
    make_sched, tensor_lr, refuse = _CASES[case]
    eager, copy = _Loop(make_sched, tensor_lr, refuse), _Loop(make_sched, tensor_lr, refuse)
    traced = graphprof.trace(copy.step)
    messages: list[str] = []
    for i in range(CALLS):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught if str(w.message).startswith("graphprof")]
        assert torch.equal(expected, got), f"loss differs after call {i}"
        for a, b in zip(eager.model.parameters(), copy.model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
        assert eager.observed() == copy.observed(), f"rates or scheduler differ after call {i}"
    if refuse:
        assert len(messages) == 1 and "restored to before the call" in messages[0]
    else:
        assert messages == []


def test_a_scheduler_stepped_through_a_method_bound_before_the_capture_is_not_replayed_silently() -> None:
    """``advance = sched.step`` made before the capture holds the class's function of then, not the patched
    one: the capture call stepped the scheduler inside the trace, unseen, and the replays never stepped it
    again (the rate stuck at the capture call's). It is refused now: segments, one warning."""
    def make() -> tuple[nn.Module, Any, Callable[[torch.Tensor], torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
        advance = sched.step

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            advance()
            return loss.detach()
        return model, sched, step

    (eager_model, eager_sched, eager), (model, sched, step) = make(), make()
    traced = graphprof.trace(step)
    messages: list[str] = []
    for i in range(CALLS):
        x = torch.full((2, 4), float(i))
        expected = eager(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x)
        messages += [str(w.message) for w in caught if str(w.message).startswith("graphprof")]
        assert torch.equal(expected, got), f"loss differs after call {i}"
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
        assert eager_sched.state_dict() == sched.state_dict(), f"scheduler differs after call {i}"
    assert len(messages) == 1 and "bound before the capture" in messages[0]
