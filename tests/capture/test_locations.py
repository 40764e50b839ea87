"""Which objects' fields are the step's state, and how graphprof writes where they live
(capture/locations.py: ``plain_object``).

A ``types.SimpleNamespace`` or ``argparse.Namespace`` kept in the step's dict
(``S["cfg"] = SimpleNamespace(count=0, ...)``) was skipped as a library's object:
its counter stopped at the capture call's value in every replay, its list stopped
growing, and a field the user changed between calls was not read, all silently.

A dict class of the user's with its own ``__setitem__`` ran it for graphprof's own
writes (the inputs put where its numbers are kept, the values put back): a dict
that records its writes recorded ten where eager's recorded six.
"""

from __future__ import annotations

import argparse
import types
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 8


def _twins(make: Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], dict, nn.Module]],
           between: Callable[[int, dict], None], observe: Callable[[dict], Any]) -> Any:
    """Run an eager and a traced copy of ``make()``'s step for ``CALLS`` calls, ``between`` applied to
    both states before each call; assert bitwise equal results, weights and observed state after
    every call, with no warning (one whole-step graph)."""
    eager_step, eager_state, eager_model = make()
    traced_step, traced_state, traced_model = make()
    traced = graphprof.trace(traced_step, profiling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(CALLS):
            between(i, eager_state)
            between(i, traced_state)
            x = torch.full((2, 4), float(i + 1))
            a, b = eager_step(x), traced(x)
            assert torch.equal(a, b), f"call {i}: result {a!r} != {b!r}"
            assert torch.equal(eager_model.weight, traced_model.weight), f"call {i}: weights differ"
            assert observe(eager_state) == observe(traced_state), f"call {i}"
    assert traced.capture_mode == "whole-step"
    return traced


def _namespace_step(kind: type, logged: str = "item"
                    ) -> Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], dict, nn.Module]]:
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict, nn.Module]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        state = {"cfg": kind(count=0, lr_scale=1.0, history=[])}

        def step(x: torch.Tensor) -> torch.Tensor:
            cfg = state["cfg"]
            loss = model(x).pow(2).mean() * cfg.lr_scale
            loss.backward()
            opt.step()
            opt.zero_grad()
            cfg.count += 1
            cfg.history.append(loss.item() if logged == "item" else cfg.count)
            return loss.detach()

        return step, state, model
    return make


def _fields(state: dict) -> tuple:
    cfg = state["cfg"]
    return cfg.count, cfg.lr_scale, list(cfg.history)


@pytest.mark.parametrize("kind", [types.SimpleNamespace, argparse.Namespace], ids=["simplenamespace", "argparse"])
@pytest.mark.parametrize("logged", ["item", "count"])
def test_a_namespace_kept_in_the_steps_dict_counts_and_logs_on_every_replay(kind: type, logged: str) -> None:
    _twins(_namespace_step(kind, logged), lambda i, state: None, _fields)


@pytest.mark.parametrize("kind", [types.SimpleNamespace, argparse.Namespace], ids=["simplenamespace", "argparse"])
def test_a_namespace_field_changed_between_calls_is_read_by_the_next_call(kind: type) -> None:
    def between(i: int, state: dict) -> None:
        if i == 4:
            state["cfg"].lr_scale = 0.5

    _twins(_namespace_step(kind), between, _fields)


class _RecordingDict(dict):
    """Records every key written, as a tracked config does."""

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("written", []).append(key)
        super().__setitem__(key, value)


class _CheckedDict(dict):
    """Takes only plain numbers."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(value) not in (int, float):
            raise TypeError(f"{key} must be a number, not {type(value).__name__}")
        super().__setitem__(key, value)


class _MirroredDict(dict):
    """Keeps each item as an attribute too (EasyDict's way)."""

    def __init__(self, **items: Any) -> None:
        super().__init__()
        for key, value in items.items():
            self[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        object.__setattr__(self, key, value)
        super().__setitem__(key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _config_step(kind: type) -> Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], dict, nn.Module]]:
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict, nn.Module]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        cfg = kind()
        dict.update(cfg, step=0, w=0.5)
        state = {"cfg": cfg}

        def step(x: torch.Tensor) -> torch.Tensor:
            c = state["cfg"]
            loss = model(x).pow(2).mean() * c["w"]
            loss.backward()
            opt.step()
            opt.zero_grad()
            c["step"] = c["step"] + 1
            return loss.detach()

        return step, state, model
    return make


def _config(state: dict) -> tuple:
    cfg = state["cfg"]
    return dict(cfg), dict(vars(cfg))


def _change_w(i: int, state: dict) -> None:
    if i == 4:
        state["cfg"]["w"] = 0.25


def test_graphprof_writes_no_key_into_a_dict_that_records_its_writes() -> None:
    """Its record has the step's writes and the user's, as eager's has, and no write of graphprof's."""
    _twins(_config_step(_RecordingDict), _change_w, _config)


def test_a_dict_that_checks_its_values_sees_the_steps_values() -> None:
    """The step's ``c["step"] = ...`` reaches its check; graphprof's own inputs and restores do not."""
    eager, traced = _config_step(_CheckedDict)(), _config_step(_CheckedDict)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = graphprof.trace(traced[0], profiling=False)
        for i in range(CALLS):
            _change_w(i, eager[1])
            _change_w(i, traced[1])
            x = torch.full((2, 4), float(i + 1))
            assert torch.equal(eager[0](x), step(x)), f"call {i}"
            assert _config(eager[1]) == _config(traced[1]), f"call {i}"
            assert torch.equal(eager[2].weight, traced[2].weight), f"call {i}"
    assert len([w for w in caught if "graphprof" in str(w.message)]) <= 1


def test_a_dict_that_keeps_its_items_as_attributes_too_keeps_them_as_eager_does() -> None:
    eager, traced = _config_step(_MirroredDict)(), _config_step(_MirroredDict)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = graphprof.trace(traced[0], profiling=False)
        for i in range(CALLS):
            for state in (eager[1], traced[1]):
                if i == 4:
                    state["cfg"].w = 0.25
            x = torch.full((2, 4), float(i + 1))
            assert torch.equal(eager[0](x), step(x)), f"call {i}"
            assert _config(eager[1]) == _config(traced[1]), f"call {i}"
            assert torch.equal(eager[2].weight, traced[2].weight), f"call {i}"
    assert len([w for w in caught if "graphprof" in str(w.message)]) <= 1
