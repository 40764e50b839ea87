"""The one-test replay check: it passes only where ``CapturedPaths.select`` would take the same path, and steady calls use it."""

from __future__ import annotations

import random
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.tracing import TracedFunction
from graphprof.tracing.captured_paths import CapturedPaths


class _Loop:
    """A step with two optimizers, nested modules, a dropout and a branch on a Python value (a guard)."""

    def __init__(self, zero_grad: bool = True) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Tanh(), nn.Dropout(0.1)), nn.Linear(4, 1))
        self.sgd = torch.optim.SGD(self.model[0].parameters(), lr=0.1, momentum=0.9)
        self.adam = torch.optim.Adam(self.model[2].parameters(), lr=1e-3)
        self.scale = 1
        self.zero_grad = zero_grad
        model, sgd, adam = self.model, self.sgd, self.adam

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if self.zero_grad:
                sgd.zero_grad()
                adam.zero_grad()
            loss = F.mse_loss(model(x), y)
            if self.scale > 2:  # a branch on the user's Python state: a guard of the graph
                loss = loss * 2
            loss.backward()
            sgd.step()
            adam.step()
            return loss

        self.traced: TracedFunction = graphprof.trace(step)
        self.x, self.y = torch.randn(8, 4), torch.randn(8, 1)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.traced(*(args or (self.x, self.y)), **kwargs)

    def path(self) -> Any:
        last = self.traced._last_signature
        assert last is not None and last.replay is not None
        return last.replay


def _selected(loop: _Loop, args: tuple, kwargs: dict) -> Any:
    """The runner ``CapturedPaths.select`` takes for this call now (None where it would capture), as the long way asks."""
    last = loop.traced._last_signature
    if last is None or not last.matches(args, kwargs):
        return None
    return loop.traced._paths.select(last.key, list(args), last)[0]


def _agrees(loop: _Loop, args: tuple | None = None, kwargs: dict | None = None) -> bool:
    """The check's answer, checked against the long way: it never passes where ``CapturedPaths.select`` would not
    take its path."""
    args, kwargs = args or (loop.x, loop.y), kwargs or {}
    path = loop.path()
    passed = path.check(args, kwargs)
    if passed:
        assert _selected(loop, args, kwargs) is path.runner
    return bool(passed)


def test_the_check_is_written_at_capture_and_steady_calls_skip_select(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _Loop()
    loop.call()
    loop.call()  # the capture call writes the check
    last = loop.traced._last_signature
    assert last is not None and loop.traced._paths.graphs[last.key][0].check is not None
    assert loop.traced.runner.captured.guards  # the branch on self.scale is guarded
    loop.call()  # the first replay asks CapturedPaths.select, and remembers its path
    asked: list[int] = []
    select = CapturedPaths.select
    monkeypatch.setattr(CapturedPaths, "select", lambda self, *a: asked.append(1) or select(self, *a))
    for _ in range(5):
        loop.call()
    assert asked == [] and _agrees(loop)


CHANGES: dict[str, Callable[[_Loop], Any]] = {
    "a deep module to eval": lambda s: s.model[1][1].eval(),
    "every module to eval": lambda s: s.model.eval(),
    "a flag assigned directly": lambda s: setattr(s.model[1][0], "training", False),
    "a group's flag": lambda s: s.sgd.param_groups[0].__setitem__("nesterov", True),
    "a learning rate made a tensor": lambda s: s.adam.param_groups[0].__setitem__("lr", torch.tensor(1e-3)),
    "a group added": lambda s: s.sgd.add_param_group({"params": [nn.Parameter(torch.zeros(1))]}),
    "the optimizers' state cleared": lambda s: s.sgd.state.clear(),
    "the guarded value": lambda s: setattr(s, "scale", 3),
    "a flag the step branches on": lambda s: setattr(s, "zero_grad", False),
    "a dropout's p": lambda s: setattr(s.model[1][1], "p", 0.5),
    "a held number's type": lambda s: setattr(s, "scale", 1.0),
    "a parameter frozen": lambda s: s.model[0].weight.requires_grad_(False),
    "an optimizer's groups replaced by a copy": lambda s: setattr(s.sgd, "param_groups", list(s.sgd.param_groups)),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_each_change_fails_the_check_or_keeps_the_same_path(name: str) -> None:
    loop = _Loop()
    for _ in range(4):
        loop.call()
    assert _agrees(loop)
    CHANGES[name](loop)
    if name == "an optimizer's groups replaced by a copy":
        assert _agrees(loop)  # the same dicts in a new list: the same path, and the check knows it
    else:
        assert not loop.path().check((loop.x, loop.y), {})


@pytest.mark.parametrize("args, kwargs", [
    ((torch.randn(9, 4), torch.randn(9, 1)), {}),  # another shape
    ((torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 1)), {}),  # another dtype
    ((torch.randn(8, 4, requires_grad=True), torch.randn(8, 1)), {}),  # requires_grad
    ((torch.randn(8, 4),), {"y": torch.randn(8, 1)}),  # a keyword argument
    ((torch.randn(8, 4), torch.randn(8, 1), torch.randn(1)), {}),  # one argument more
    ((torch.randn(8, 4), 1.0), {}),  # not a tensor
])
def test_another_signature_fails_the_check(args: tuple, kwargs: dict) -> None:
    loop = _Loop()
    for _ in range(4):
        loop.call()
    assert not loop.path().check(args, kwargs)


def test_grad_mode_is_part_of_the_check() -> None:
    loop = _Loop()
    for _ in range(4):
        loop.call()
    with torch.no_grad():
        assert not loop.path().check((loop.x, loop.y), {})


def test_random_changes_and_reverts_never_pass_where_select_would_not() -> None:
    """Changes applied and undone at random: whenever the check passes, ``CapturedPaths.select`` takes its path."""
    rng = random.Random(0)
    loop = _Loop()
    for _ in range(4):
        loop.call()
    flips: list[Callable[[_Loop], Any]] = [
        lambda s: s.model[rng.randrange(3)].train(rng.random() < 0.5),
        lambda s: s.sgd.param_groups[0].__setitem__("nesterov", rng.random() < 0.3),
        lambda s: s.adam.param_groups[0].__setitem__("lr", rng.choice([1e-3, 2e-3, 1, torch.tensor(1e-3)])),
        lambda s: setattr(s, "scale", rng.choice([1, 2, 3])),
    ]
    passed = 0
    for _ in range(200):
        rng.choice(flips)(loop)
        passed += _agrees(loop)
    assert 0 < passed < 200  # both answers were exercised


def test_a_loop_switching_modes_replays_both_paths_as_eager_does() -> None:
    """train/eval alternation: the first path's check fails in eval, the long way takes the second."""
    eager_loop, loop = _Loop(), _Loop()
    eager_step = eager_loop.traced._fn
    for i in range(10):
        for s in (eager_loop, loop):
            s.model.train(i % 3 != 2)
        torch.manual_seed(i)
        expected = eager_step(eager_loop.x, eager_loop.y)
        torch.manual_seed(i)
        got = loop.call()
        assert torch.equal(expected, got), f"call {i}"
    for a, b in zip(eager_loop.model.parameters(), loop.model.parameters()):
        assert torch.equal(a, b)
    assert loop.traced.captures == 2
