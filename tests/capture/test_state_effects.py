"""The effects a replay repeats for the dicts of the step's state (capture/state_effects.py), on the
dict classes of ``collections``.

A ``collections.Counter`` whose key first appeared on a capture call
(``S["cnt"][phase] += 1``, the phase switching from "warm" to "main") counted one
too many from then on: the new key was written with ``Counter.update``, which adds
counts where a dict's ``update`` replaces them. An ``OrderedDict`` whose key the
step moved to the end (``d[k] = d.pop(k)``, ``move_to_end``) was replayed in the capture call's order.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import pytest
import torch

import graphprof

CALLS = 8

_KINDS: dict[str, Callable[[], dict]] = {
    "counter": collections.Counter,
    "defaultdict": lambda: collections.defaultdict(int),
    "ordereddict": collections.OrderedDict,
    "dict": dict,
}


def _twins(make: Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], dict]],
           whole_step: bool = True) -> list[str]:
    """Run an eager and a traced copy of ``make()``'s step; assert bitwise equal results and equal
    dicts (items, key order and class) after every call. Returns graphprof's warnings."""
    eager_step, eager_state = make()
    traced_step, traced_state = make()
    traced = graphprof.trace(traced_step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.full((3,), float(i + 1))
            a, b = eager_step(x), traced(x)
            assert torch.equal(a, b), f"call {i}: result {a!r} != {b!r}"
            for name, kept in eager_state.items():
                other = traced_state[name]
                if isinstance(kept, torch.Tensor):
                    assert torch.equal(kept, other), f"call {i}: {name} differs"
                else:
                    assert type(kept) is type(other) and kept == other, f"call {i}: {name}: {kept!r} != {other!r}"
                    if isinstance(kept, dict):
                        assert list(kept.items()) == list(other.items()), f"call {i}: {name}: {kept!r} != {other!r}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    if whole_step:
        assert not messages and traced.capture_mode == "whole-step", messages
    return messages


def _phase_counter(kind: str, read: str) -> Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], dict]]:
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict]:
        w = torch.zeros(3)
        state: dict[str, Any] = {"cnt": _KINDS[kind](), "i": 0, "w": w}
        if kind in ("ordereddict", "dict"):
            state["cnt"]["first"] = 0

        def step(x: torch.Tensor) -> torch.Tensor:
            w.add_(x)
            phase = "warm" if state["i"] < 2 else ("main" if state["i"] < 5 else "tail")
            cnt = state["cnt"]
            if read == "get":
                cnt[phase] = cnt.get(phase, 0) + 1
            else:
                cnt[phase] += 1 if phase in cnt or kind in ("counter", "defaultdict") else 0
            state["i"] += 1
            return w.sum() * cnt[phase]

        return step, state
    return make


@pytest.mark.parametrize("kind", ["counter", "defaultdict"])
def test_a_key_the_step_adds_on_a_capture_call_is_counted_once(kind: str) -> None:
    _twins(_phase_counter(kind, "item"))


@pytest.mark.parametrize("kind", list(_KINDS))
def test_a_key_the_step_sets_on_a_capture_call_keeps_eagers_value_and_order(kind: str) -> None:
    _twins(_phase_counter(kind, "get"))


def test_keys_the_step_reorders_are_in_eagers_order() -> None:
    kind = "dict"
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict]:
        w = torch.zeros(3)
        recent = _KINDS[kind]()
        recent.update(a=1, b=2, c=3)
        state = {"recent": recent, "w": w}

        def reinsert(x: torch.Tensor) -> torch.Tensor:
            w.add_(x)
            first = next(iter(recent))
            recent[first] = recent.pop(first)
            return w.sum() * recent[first]

        return reinsert, state

    messages = _twins(make, whole_step=False)
    assert len(messages) <= 1, messages
