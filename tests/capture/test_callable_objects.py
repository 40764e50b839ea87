"""A callable object as the step: ``Trainer(...)`` traced itself, its ``__call__`` the step's code.

Such an object has no ``__code__``, ``__self__`` or closure, so the step's
analysis reached nothing through it: its fields were not watched (a refused
capture left ``self.n`` counted and the fallback counted it again, one ahead
of eager), its model and optimizer were found only while the step ran, and
no frame was the step's own, so a ``try`` of the caller around the traced
call refused the capture as if the step caught exceptions. Its ``__call__``,
bound to it, is now the step, as a bound method's function is.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 5


class Stepper:
    """A trainer written as a class: ``__call__`` hands the batch to ``train_step``, which counts."""

    def __init__(self, branch: bool) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(8, 4)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.n = 0
        self.branch = branch

    def __call__(self, *batch: torch.Tensor, **kw: Any) -> torch.Tensor:
        return self.train_step(*batch, **kw)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.n += 1
        loss = F.cross_entropy(self.model(x), y)
        if self.branch and loss > 100:  # a branch on a value: the capture is refused (the documented fallback)
            print("diverged")
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.detach()


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.arange(4)


def _compare(branch: bool, callers_try: bool) -> tuple[Any, list[str]]:
    """Run eager and traced steppers side by side, comparing after every call; the graphprof warnings."""
    eager, stepper = Stepper(branch), Stepper(branch)
    traced = graphprof.trace(stepper, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, y = _batch(i)
            expected = eager(x, y)
            if callers_try:
                try:
                    got = traced(x, y)
                except ValueError:  # the caller's own handling: never raised here
                    continue
            else:
                got = traced(x, y)
            assert torch.equal(expected, got), f"call {i}"
            assert eager.n == stepper.n, f"call {i}: counter eager {eager.n}, traced {stepper.n}"
            assert all(torch.equal(p, q) for p, q in zip(eager.model.parameters(), stepper.model.parameters()))
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def test_a_refused_capture_puts_the_objects_own_counter_back() -> None:
    """The capture call runs the step's Python, is refused (the branch), and the step runs again as
    segments: the counter is counted once on that call, as in eager."""
    traced, messages = _compare(branch=True, callers_try=False)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "branching on a tensor" in messages[0], messages


def test_the_callers_try_around_the_traced_call_is_not_the_steps() -> None:
    traced, messages = _compare(branch=False, callers_try=True)
    assert messages == [] and traced.capture_mode == "whole-step"


def test_the_objects_counter_is_an_input_of_one_graph() -> None:
    """Read at run time and written back by each replay: one capture serves every call."""
    traced, messages = _compare(branch=False, callers_try=False)
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1


class Skipping(Stepper):
    """A trainer whose own ``__call__`` catches a bad batch's error."""

    def __call__(self, *batch: torch.Tensor, **kw: Any) -> Any:
        try:
            return self.train_step(*batch, **kw)
        except IndexError:
            return None


def test_a_try_in_the_objects_own_call_refuses_the_capture() -> None:
    """Read from ``__call__``'s source before anything runs: the bad batch, on a later call, is caught
    by the step's Python as in eager."""
    bad_call = 3
    eager, stepper = Skipping(False), Skipping(False)
    traced = graphprof.trace(stepper)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, y = _batch(i)
            if i == bad_call:
                y = torch.tensor([0, 1, 2, 40])  # a class index out of range: cross_entropy raises
            expected, got = eager(x, y), traced(x, y)
            assert (expected is None and got is None) or torch.equal(expected, got), f"call {i}"
            assert eager.n == stepper.n, f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "catches exceptions at" in messages[0], messages


class _SlottedTrainer:
    """A trainer class with ``__slots__``: no ``__dict__`` for its fields."""

    __slots__ = ("model", "opt", "n")

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.n = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.n += 1
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()


def test_a_trainer_with_slots_counts_as_eager_counts() -> None:
    """Its fields were read with ``vars()``, which a slotted object refuses: the second call raised a
    TypeError; and a counter in a slot was not watched, so replays did not count."""
    eager, trainer = _SlottedTrainer(), _SlottedTrainer()
    traced = graphprof.trace(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"call {i}"
            assert trainer.n == eager.n == i + 1, f"call {i}"
    assert traced.capture_mode == "whole-step"


class PartialStepper:
    """``__call__`` is ``functools.partialmethod(run, scale=2.0)``: Python binds it as a partial of the
    bound method. Its object's fields were not watched, so the log it appends to got graphprof's
    traced numbers, not floats, on every replay."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(8, 4)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.n = 0
        self.log: list[float] = []

    def run(self, x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(x), y) * scale
        loss.backward()
        self.opt.step()
        self.n += 1
        self.log.append(loss.item())
        return loss.detach()

    __call__ = functools.partialmethod(run, scale=2.0)


def test_a_partialmethod_call_logs_and_counts_as_eager() -> None:
    eager, stepper = PartialStepper(), PartialStepper()
    traced = graphprof.trace(stepper, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no graphprof warning: whole-step
        for i in range(CALLS):
            assert torch.equal(eager(*_batch(i)), traced(*_batch(i))), f"call {i}"
            assert [type(v) for v in stepper.log] == [float] * (i + 1), f"call {i}"
            assert stepper.log == eager.log and stepper.n == eager.n, f"call {i}"
            for a, b in zip(eager.model.parameters(), stepper.model.parameters()):
                assert torch.equal(a, b), f"call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 1
