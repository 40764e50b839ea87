"""A ``collections.deque`` the step appends to is extended by every replay, as a list is
(capture/state_effects.py, ``_appended``).

torchvision's reference scripts log through ``MetricLogger.update(loss=...)``,
whose ``SmoothedValue`` appends each value to a ``deque(maxlen=window)`` and
counts ``count`` and ``total``. The deque was not watched: the step was
refused and ran as segments. A full deque drops items from its left as it
appends: the items the step appended are told from the ones it kept by
identity, and a change that is not an append (``appendleft``, ``pop``), or
a read of the deque the step appends to, still refuses.
"""

from __future__ import annotations

import warnings
from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import SmoothedValue

CALLS = 7


class MetricLogger:
    def __init__(self) -> None:
        self.meters: defaultdict[str, SmoothedValue] = defaultdict(SmoothedValue)

    def update(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            assert isinstance(v, (float, int))
            self.meters[k].update(v)


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)


def _run(log: Callable[[Any, torch.Tensor, torch.optim.Optimizer], Any], kept: Callable[[], Any],
         seen: Callable[[Any], Any]) -> tuple[Any, list[str]]:
    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = kept()

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log(state, loss, opt)
            return loss

        return step, state

    (eager, eager_state), (step, state) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    messages: list[str] = []
    for i in range(CALLS):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x, y = _batch(i)
            assert torch.equal(eager(x, y).detach(), traced(x, y)), f"call {i}"
        messages += [str(w.message) for w in caught]
        a, b = seen(eager_state), seen(state)
        assert a == b and [type(v) for v in a] == [type(v) for v in b], f"call {i}: {a} != {b}"
    return traced, messages


def test_torchvisions_metric_logger_is_replayed_whole_step() -> None:
    def kept() -> MetricLogger:
        logger = MetricLogger()
        logger.meters["loss"] = SmoothedValue(window_size=3)
        return logger

    def seen(logger: MetricLogger) -> list[Any]:
        return [v for meter in logger.meters.values() for v in (*meter.deque, meter.count, meter.total)]

    traced, messages = _run(lambda logger, loss, opt: logger.update(loss=loss, lr=opt.param_groups[0]["lr"]),
                            kept, seen)
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


@pytest.mark.parametrize("maxlen", [None, 2])
def test_a_deque_of_losses_gets_each_calls_losses(maxlen: int | None) -> None:
    def log(kept: Any, loss: torch.Tensor, opt: Any) -> None:
        kept.window.append(loss.item())
        kept.window.append(loss.item() * 2)

    traced, messages = _run(log, lambda: SimpleNamespace(window=deque([0.5], maxlen=maxlen)),
                            lambda kept: list(kept.window))
    assert messages == []
    assert traced.capture_mode == "whole-step"


@pytest.mark.parametrize("change", ["appendleft", "read"])
def test_a_deque_changed_otherwise_or_read_refuses_the_capture(change: str) -> None:
    def log(kept: Any, loss: torch.Tensor, opt: Any) -> Any:
        if change == "appendleft":
            kept.window.appendleft(loss.item())
            return None
        kept.window.append(loss.item())
        return sum(kept.window) / len(kept.window)  # a moving average: the capture call's items, as constants

    traced, messages = _run(log, lambda: SimpleNamespace(window=deque([0.5], maxlen=3)),
                            lambda kept: list(kept.window))
    assert len(messages) == 1 and "segments" in messages[0]
    assert traced.capture_mode == "segments"


@pytest.mark.parametrize("constant", [False, True])
def test_a_deque_full_when_captured_takes_one_value_per_call(constant: bool) -> None:
    """Full, any count of appends fills it anew, so the count is the fewest that keeps its items in
    order; a constant appended again (the same object) leaves the same items for any count."""
    def log(kept: Any, loss: torch.Tensor, opt: Any) -> None:
        kept.window.append(4 if constant else loss.item())

    traced, messages = _run(log, lambda: SimpleNamespace(window=deque([4, 4], maxlen=2)),
                            lambda kept: list(kept.window))
    assert messages == []
    assert traced.capture_mode == "whole-step"
