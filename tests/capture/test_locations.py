"""Which objects' fields are the step's state, and how graphprof writes where they live
(capture/locations.py: ``plain_object``).

A ``types.SimpleNamespace`` or ``argparse.Namespace`` kept in the step's dict
(``S["cfg"] = SimpleNamespace(count=0, ...)``) was skipped as a library's object:
its counter stopped at the capture call's value in every replay, its list stopped
growing, and a field the user changed between calls was not read, all silently.
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
