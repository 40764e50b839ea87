"""Module fields no code of the step names are not held: a loop's bookkeeping on the model costs nothing.

Every Python value kept on a module was held by the graph as it was at
capture (the step's Python might have read it), and checked before every
replay. A field the loop sets between calls (``model.epoch = epoch``), that
the step never reads, made each change capture again, and one set on every
call made five captures in a row and fell back to segments. The capture
call now notes the names of all code it runs (the step's and the
libraries'); a module field whose name none of it has could not have been
read, and is not held. So is every module's ``training`` flag when no code
names ``training`` (a model without dropout or batch norm). A name read
dynamically (``getattr(self, name)``) keeps every field held.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof


class _Net(nn.Module):
    def __init__(self, dropout: float = 0.0, dynamic: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scale_on = True  # read by forward
        self.epoch = 0  # the loop's bookkeeping: never read by the step
        self.flag = "scale_on"
        self.dynamic = dynamic

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.lin(x))
        on = getattr(self, self.flag) if self.dynamic else self.scale_on
        return y * 2 if on else y


def _setup(**options: Any) -> tuple[_Net, Callable[[torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    net = _Net(**options)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return net, step


def _run(between: Callable[[_Net, int], None], calls: int = 10, **options: Any) -> Any:
    """Eager and traced, ``between(net, i)`` before call i; results and parameters compared after every call."""
    runs = []
    fn: Any = None
    for traced in (False, True):
        net, step = _setup(**options)
        fn = graphprof.trace(step) if traced else step
        run = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            for i in range(calls):
                between(net, i)
                torch.manual_seed(i)
                run.append((fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i))),
                            [p.detach().clone() for p in net.parameters()]))
        runs.append(run)
    for k, ((a, pa), (b, pb)) in enumerate(zip(*runs)):
        assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(pa, pb)), f"differs after call {k}"
    return fn


def _epoch_on_every_call(net: _Net, i: int) -> None:
    net.epoch = i


def test_a_field_the_loop_sets_on_every_call_and_the_step_never_reads_is_not_held() -> None:
    fn = _run(_epoch_on_every_call)
    assert fn.capture_mode == "whole-step" and fn.captures == 1


def test_a_field_the_step_reads_is_still_held() -> None:
    def between(net: _Net, i: int) -> None:
        net.epoch = i
        net.scale_on = i < 5

    fn = _run(between)
    assert fn.capture_mode == "whole-step" and fn.captures == 2  # one graph per value of scale_on


def test_a_name_read_dynamically_keeps_every_field_held() -> None:
    def between(net: _Net, i: int) -> None:
        net.scale_on = i < 5  # the step reads it as getattr(self, self.flag)

    fn = _run(between, dynamic=True)
    assert fn.captures == 2


def _eval_on_odd_calls(net: _Net, i: int) -> None:
    net.train(i % 2 == 0)


def test_modes_switched_between_calls_capture_once_without_dropout_and_once_per_mode_with_it() -> None:
    assert _run(_eval_on_odd_calls).captures == 1  # no code the step runs names ``training``
    assert _run(_eval_on_odd_calls, dropout=0.5).captures == 2  # Dropout.forward reads self.training
