"""NumPy schedules indexed by the step's counter are read by every replay (capture/indexed_arrays.py).

DINO's loop (and iBOT's, BEiT's, ConvNeXt's) computes its learning-rate,
weight-decay and EMA-momentum schedules once as numpy arrays and sets
``g["lr"] = lr_schedule[it]`` with ``it`` a counter the step keeps. numpy
took ``__index__`` of the counter, a guard on its value: one capture per
call, and from the sixth call on the step ran as segments, with a warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

#: A module-level schedule, as a script's global (``fallbacks_min.py``'s form).
GLOBAL_SCHEDULE = np.linspace(1e-3, 1e-4, 20)


class _TeacherLoss(nn.Module):
    """DINO's loss: the teacher's temperature is ``self.teacher_temp_schedule[epoch]``."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher_temp_schedule = np.concatenate((np.linspace(0.04, 0.07, 3), np.full(5, 0.07)))

    def forward(self, student: torch.Tensor, teacher: torch.Tensor, epoch: int) -> torch.Tensor:
        temp = self.teacher_temp_schedule[epoch]
        targets = F.softmax(teacher / temp, dim=-1).detach()
        return -(targets * F.log_softmax(student / 0.1, dim=-1)).sum(-1).mean()


def _dino_step(where: str) -> tuple[Callable[[torch.Tensor], None], dict[str, Any]]:
    """A DINO-shaped step whose schedules are kept ``where``: in the step's closure, a global, or a
    trainer object's attributes."""
    torch.manual_seed(0)
    student, teacher = nn.Linear(6, 5), nn.Linear(6, 5)
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)
    loss_fn = _TeacherLoss()
    opt = torch.optim.AdamW([{"params": [student.weight]}, {"params": [student.bias], "weight_decay": 0.0}])
    lr_schedule = np.linspace(5e-4, 1e-5, 20)
    wd_schedule = 0.04 + 0.36 * (1 - np.cos(np.pi * np.arange(20) / 20)) / 2
    momentum_schedule = np.linspace(0.996, 1.0, 20)
    trainer = type("Trainer", (), {})()
    trainer.lr, trainer.wd, trainer.m = lr_schedule, wd_schedule, momentum_schedule
    S: dict[str, Any] = {"it": 0, "student": student, "teacher": teacher, "opt": opt, "loss": loss_fn,
                         "trainer": trainer}

    def step(x: torch.Tensor) -> None:
        it = S["it"]
        epoch = it // 3
        lrs = {"closure": lr_schedule, "global": GLOBAL_SCHEDULE, "object": trainer.lr}[where]
        for i, group in enumerate(opt.param_groups):
            group["lr"] = lrs[it]
            if i == 0:
                group["weight_decay"] = (trainer.wd if where == "object" else wd_schedule)[it]
        loss = loss_fn(student(x), teacher(x), epoch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            m = (trainer.m if where == "object" else momentum_schedule)[it]
            for q, k in zip(student.parameters(), teacher.parameters()):
                k.mul_(m).add_((1 - m) * q.detach())
        S["it"] = it + 1

    S["lr_schedule"] = lr_schedule
    return step, S


def _observed(S: dict[str, Any]) -> list[Any]:
    """What the user sees after a call: both models' tensors, gradients, the optimizer's state and
    numbers (with their types: eager's groups hold ``numpy.float64``) and the counter."""
    seen: list[Any] = [S["it"]]
    for module in (S["student"], S["teacher"]):
        for p in module.parameters():
            seen += [p.detach().clone(), None if p.grad is None else p.grad.clone()]
    for state in S["opt"].state.values():
        seen += [v.clone() for v in state.values()]
    for group in S["opt"].param_groups:
        seen += [(k, v, type(v)) for k, v in group.items() if k != "params"]
    return seen


def _assert_same(expected: list[Any], got: list[Any], where: str) -> None:
    assert len(expected) == len(got), where
    for a, b in zip(expected, got):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), where
        else:
            assert a == b, where


def _twins(where: str, calls: int, between: Callable[[int, dict[str, Any]], None] = lambda i, S: None
           ) -> tuple[Any, list[str]]:
    """Run the step eagerly and traced for ``calls`` calls, comparing after each; the traced function and
    graphprof's warnings."""
    eager_step, eager = _dino_step(where)
    step, state = _dino_step(where)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            between(i, eager)
            between(i, state)
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
            eager_step(x)
            traced(x)
            _assert_same(_observed(eager), _observed(state), f"after call {i}")
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


@pytest.mark.parametrize("where", ["closure", "global", "object"])
def test_schedules_indexed_by_the_counter_replay_one_graph(where: str) -> None:
    """lr, weight decay and EMA momentum from arrays, the teacher's temperature from a module's array:
    eager's numbers on every call from one graph, where each call captured again."""
    traced, warned = _twins(where, calls=8)
    assert warned == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_an_array_changed_in_place_between_calls_is_read_as_it_is_now() -> None:
    """The replay reads the user's array where eager reads it: a schedule rewritten in place (a restart
    that rescales it) gives the new rates, with no capture more."""
    def rescale(i: int, S: dict[str, Any]) -> None:
        if i == 4:
            S["lr_schedule"][:] *= 0.5

    traced, warned = _twins("closure", calls=8, between=rescale)
    assert warned == []
    assert traced.captures == 1


def test_an_array_rebound_to_another_captures_again() -> None:
    """A schedule replaced by another array is another value the graph was decided on."""
    def rebind(i: int, S: dict[str, Any]) -> None:
        if i == 4:
            S["trainer"].lr = S["trainer"].lr * 0.5

    traced, warned = _twins("object", calls=8, between=rebind)
    assert warned == []
    assert traced.captures == 2


def test_an_index_past_the_end_raises_as_eager_does() -> None:
    """The index's range is a path: a call past the schedule's end captures again and raises eager's
    IndexError."""
    eager_step, eager = _dino_step("closure")
    step, state = _dino_step("closure")
    traced = graphprof.trace(step, profiling=False)
    for i in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
        eager_step(x)
        traced(x)
    eager["it"] = state["it"] = 20
    x = torch.randn(4, 6)
    with pytest.raises(IndexError) as eager_error:
        eager_step(x)
    with pytest.raises(IndexError) as traced_error:
        traced(x)
    assert str(traced_error.value) == str(eager_error.value)
    _assert_same(_observed(eager), _observed(state), "after the failed call")


def test_a_step_writing_into_the_array_is_not_replayed() -> None:
    """A write a replay would not repeat: the step is profiled another way, with one warning, and the
    array holds what eager's holds."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], np.ndarray, nn.Module]:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = np.zeros(8)
        S = {"it": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            for g in opt.param_groups:
                g["lr"] = 0.1 + seen[S["it"]]
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen[0] += 0.5  # a constant place: nothing else would make the capture call's write seen
            S["it"] += 1
            return loss.detach()
        return step, seen, model

    eager_step, eager_seen, eager_model = make()
    step, seen, model = make()
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.randn(2, 3, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager_step(x), traced(x)), f"call {i}"
            assert np.array_equal(eager_seen, seen), f"call {i}"
            assert all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), model.parameters()))
    assert traced.capture_mode != "whole-step"
    assert any("writes into the numpy array" in str(w.message) for w in caught)



def test_the_schedule_and_arrays_derived_from_it_print_as_plain_arrays(capsys: pytest.CaptureFixture[str]) -> None:
    """During the capture call the schedule is graphprof's view of it; printed, it and the arrays the step
    derives from it read as eager's (numpy's repr names an array's class)."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
        torch.manual_seed(0)
        schedule = np.linspace(1.0, 2.0, 6) * 1e-2
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kept: dict[str, Any] = {"it": 0, "model": model}

        def step(x: torch.Tensor) -> torch.Tensor:
            it = kept["it"]
            print(repr(schedule), repr(schedule * 2), repr(schedule.copy()), type(np.exp(schedule)).__name__)
            for group in opt.param_groups:
                group["lr"] = schedule[it]
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept["it"] = it + 1
            return loss.detach()
        return step, kept

    runs = []
    for traced in (False, True):
        step, kept = make()
        fn = graphprof.trace(step) if traced else step
        printed = []
        for i in range(4):
            fn(torch.full((3,), float(i)))
            printed.append(capsys.readouterr().out)
        runs.append((printed, [p.detach().clone() for p in kept["model"].parameters()]))
        if traced:
            assert fn.captures == 1 and fn.capture_mode == "whole-step"
    (printed_e, params_e), (printed_t, params_t) = runs
    assert printed_t == printed_e
    assert all(torch.equal(a, b) for a, b in zip(params_e, params_t))
