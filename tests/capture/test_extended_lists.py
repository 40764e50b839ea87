"""A step that reads a list it also appends to: refused with one warning, not replayed with stale items.

``hist.append(loss.item())`` is replayed (an effect at the graph's end), but
what the step computed from the list's other items or its length (a moving
average ``sum(hist[-3:]) / 3``, ``loss / len(hist)``) was computed once,
from the capture call's items, and frozen into the graph as constants: every
replay returned the capture call's average, silently. The capture call's
trace of the user's frames notes each load of the list that is not an
append; such a step is profiled as segments, with a warning, and equals
eager. Reading back the item just appended (``hist[-1]``) is this call's own
value, a graph value, and stays whole-step; so do a list of numbers' length,
items and sum read where the step names the list (capture/growing_lists.py,
tests/capture/test_growing_lists.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import graphprof

CALLS = 6
Reader = Callable[[Any, torch.Tensor], Any]


class _Trainer:
    def __init__(self) -> None:
        self.history: list[float] = []


def _make(log: Reader) -> tuple[Callable[[torch.Tensor], Any], Callable[[], Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hist: list[float] = []
    trainer = _Trainer()
    logs: dict[str, list[float]] = {"loss": []}
    where = {"hist": hist, "trainer": trainer, "logs": logs}

    def step(x: torch.Tensor) -> Any:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach(), log(where, loss)

    return step, lambda: (list(hist), list(trainer.history), list(logs["loss"]))


def _moving_average(w: Any, loss: torch.Tensor) -> float:
    hist = w["hist"]
    hist.append(loss.item())
    return sum(hist[-3:]) / len(hist[-3:])


def _scaled_by_count(w: Any, loss: torch.Tensor) -> torch.Tensor:
    w["hist"].append(loss.item())
    return loss.detach() / len(w["hist"])


def _previous_before_append(w: Any, loss: torch.Tensor) -> float:
    hist = w["hist"]
    previous = hist[-1] if hist else 0.0  # the last call's value: read before this call appends
    hist.append(loss.item())
    return previous


def _attribute_mean(w: Any, loss: torch.Tensor) -> float:
    trainer = w["trainer"]
    trainer.history.append(loss.item())
    return sum(trainer.history) / len(trainer.history)


def _dict_item_mean(w: Any, loss: torch.Tensor) -> float:
    logs = w["logs"]
    logs["loss"].append(loss.item())
    return sum(logs["loss"]) / len(logs["loss"])


def _count_beside_getattr(w: Any, loss: torch.Tensor) -> int:
    """``getattr`` anywhere in the step (``getattr(model, "module", model)``) loads names dynamically:
    the read of the list was once not looked at, and every replay appended the capture call's length (read
    before the append, where the list's view does not answer)."""
    getattr(w["trainer"], "unwrapped", None)
    hist = w["hist"]
    hist.append(len(hist))
    return len(hist)


def _numpy_mean(w: Any, loss: torch.Tensor) -> float:
    mean = float(np.mean(w["hist"])) if w["hist"] else 0.0  # numpy reads the list's items itself
    w["hist"].append(loss.item())
    return mean


def _copied(w: Any, loss: torch.Tensor) -> float:
    hist = w["trainer"].history
    hist.append(loss.item())
    window = list(hist)[-3:]  # a copy: its items and length are the capture call's
    return sum(window) / len(window)


def _tensors_read_back(w: Any, loss: torch.Tensor) -> torch.Tensor:
    w["logs"]["loss"].append(loss.detach())  # tensors, not numbers: no view answers for the list
    return torch.stack(w["logs"]["loss"][-2:]).mean() if len(w["logs"]["loss"]) > 1 else loss.detach()


#: Reads a list's view does not answer (capture/growing_lists.py): numpy or ``list()`` reading its items
#: in C, a list of tensors read other than by its last item, a read before the step appends.
READERS: dict[str, Reader] = {"numpy's mean": _numpy_mean, "a copy": _copied, "tensors read back": _tensors_read_back,
                              "the previous item": _previous_before_append, "a count beside getattr": _count_beside_getattr}


def _run(log: Reader) -> tuple[Any, list[str]]:
    (eager, eager_lists), (step, lists) = _make(log), _make(log)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            (la, a), (lb, b) = eager(x), traced(x)
            assert torch.equal(la, lb), f"loss differs after call {i}"
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), f"what the step read differs after call {i}"
            assert eager_lists() == lists(), f"the lists differ after call {i}"
    return traced, [str(w.message) for w in caught]


@pytest.mark.parametrize("case", list(READERS))
def test_a_step_reading_a_list_it_extends_is_refused_and_equals_eager(case: str) -> None:
    traced, messages = _run(READERS[case])
    assert traced.capture_mode == "segments"
    assert sum("a list it also appends to" in m for m in messages) == 1, messages


def _append_only(w: Any, loss: torch.Tensor) -> None:
    w["hist"].append(loss.item())
    w["trainer"].history.append(loss.item())
    w["logs"]["loss"].append(loss.item())


def _last_appended(w: Any, loss: torch.Tensor) -> float:
    w["hist"].append(loss.item())
    return w["hist"][-1] * 2  # this call's own value (``h = w["hist"]`` first would count as a read)


@pytest.mark.parametrize("log", [_append_only, _last_appended, _scaled_by_count, _attribute_mean, _dict_item_mean,
                                 _moving_average],
                         ids=["append only", "the item just appended", "a count", "an attribute's mean",
                              "a dict item's mean", "a moving average"])
def test_appending_and_reading_back_stay_whole_step(log: Reader) -> None:
    traced, messages = _run(log)
    assert traced.capture_mode == "whole-step" and not messages
