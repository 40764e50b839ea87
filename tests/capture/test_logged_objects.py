"""Loggers the way training scripts keep them: a dict of ``AverageMeter`` objects, a metric logger.

``meters["loss"].update(loss.item(), n)`` changes the fields of an object in a
dict of the step's own. Only objects the step names were watched (and their
fields one level down), so the meter's fields were left holding graphprof's
``TracedScalar`` values from the capture call, and no replay updated them:
the averages a script printed were silently wrong, and comparing one raised.
The fields of objects in the step's lists and dicts are now watched like
those of an object it names (numbers read at run time, assignments
replayed); and whatever number read from a tensor is still left in the
user's objects after the step's effects refuses the capture with one
warning (a ``set`` of values seen cannot even take one: it hashes it).
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof
from tests.helpers import SmoothedValue

CALLS = 6


class AverageMeter:
    """As in the PyTorch ImageNet example."""

    def __init__(self) -> None:
        self.val = 0.0
        self.sum = 0.0
        self.count = 0
        self.avg = 0.0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def _make(log: Callable[[Any, torch.Tensor, int], None], kept: Callable[[], Any]) -> tuple[Callable[..., Any], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = kept()

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        log(state, loss, x.size(0))
        return loss.detach()

    return step, state


def _observed(state: Any) -> Any:
    meters = [m for m in state.values() if not isinstance(m, _Remote)] if isinstance(state, dict) else [state]
    return [{k: (list(v) if isinstance(v, collections.deque) else sorted(v) if isinstance(v, set) else v)
             for k, v in vars(m).items()} for m in meters]


def _run(log: Callable[[Any, torch.Tensor, int], None], kept: Callable[[], Any]) -> tuple[Any, list[str]]:
    (eager, eager_state), (step, state) = _make(log, kept), _make(log, kept)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"loss differs after call {i}"
            observed = _observed(state)
            assert all(type(v) in (int, float, list) for fields in observed for v in fields.values()), observed
            assert observed == _observed(eager_state), f"the meters differ after call {i}"
    return traced, [str(w.message) for w in caught]


def _update_meters(meters: dict[str, AverageMeter], loss: torch.Tensor, n: int) -> None:
    meters["loss"].update(loss.item(), n)
    meters["scaled"].update(loss.item() * 10, n)


def test_a_dict_of_average_meters_is_replayed_whole_step() -> None:
    traced, messages = _run(_update_meters, lambda: {"loss": AverageMeter(), "scaled": AverageMeter()})
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def _shared_meters() -> dict[str, AverageMeter]:
    """Two meters of one state: instances sharing one ``__dict__`` (the Borg pattern), each copy its own."""

    class SharedMeter(AverageMeter):
        state: dict[str, Any] = {}

        def __init__(self) -> None:
            self.__dict__ = SharedMeter.state
            super().__init__()

    return {"loss": SharedMeter(), "scaled": SharedMeter()}


def test_meters_sharing_one_dict_are_watched_once() -> None:
    """Watched once per instance, the second watch would see the inputs the first put in the shared
    dict, and hold them: a capture per call."""
    traced, messages = _run(_update_meters, _shared_meters)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def _update_smoothed(meter: SmoothedValue, loss: torch.Tensor, n: int) -> None:
    meter.update(loss.item(), n)


def test_a_smoothed_values_deque_is_extended_by_every_replay() -> None:
    """It refused the capture before deques were watched (tests/capture/test_deques.py)."""
    traced, messages = _run(_update_smoothed, lambda: SmoothedValue(window_size=3))
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


class _Seen:
    def __init__(self) -> None:
        self.values: set[float] = set()


def _note_seen(kept: _Seen, loss: torch.Tensor, n: int) -> None:
    kept.values.add(loss.item())


def test_a_value_left_in_a_set_refuses_the_capture_with_one_warning() -> None:
    """A set is not watched: the number it would hash is only known when the replay runs."""
    traced, messages = _run(_note_seen, _Seen)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "tests/capture/test_logged_objects.py" in messages[0], messages  # names the line


class _Remote:
    """A proxy whose attribute lookup refuses ``__dict__`` (a remote handle keeps no local state)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "__dict__":
            raise RuntimeError("a remote object has no local state")
        return object.__getattribute__(self, name)


def _log_beside_a_proxy(state: dict[str, Any], loss: torch.Tensor, n: int) -> None:
    state["meter"].update(loss.item(), n)


def test_a_proxy_in_the_step_s_dict_is_looked_at_without_its_own_attribute_lookup() -> None:
    """Watching the objects in the step's dicts reads their fields as the interpreter keeps them."""
    traced, messages = _run(_log_beside_a_proxy, lambda: {"meter": AverageMeter(), "remote": _Remote()})
    assert traced.capture_mode == "whole-step" and not messages
