"""Lists and dicts inside the step's own lists and dicts: ``metrics["losses"].append(loss.item())``.

Only the outer dict was watched, and it did not change (the inner list is
the same object), so the append happened in the capture call only, and
what it appended was graphprof's traced number, which raised when compared.
A ``defaultdict`` was not watched at all.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6


def _make(log: Callable[[Any, torch.Tensor], None], kept: Callable[[], Any]) -> tuple[Callable[..., torch.Tensor], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = kept()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(state, loss)
        return loss.detach()
    return step, state


def _append(metrics: Any, loss: torch.Tensor) -> None:
    metrics["losses"].append(loss.item())
    metrics["counts"]["steps"] += 1


def _autovivify(logs: Any, loss: torch.Tensor) -> None:
    logs["loss"].append(loss.item())  # the key is made by the first call that logs


def _setdefault(logs: Any, loss: torch.Tensor) -> None:
    logs.setdefault("loss", []).append(round(loss.item(), 3))


CASES: dict[str, tuple[Callable[[Any, torch.Tensor], None], Callable[[], Any]]] = {
    "a list and a counter in a dict": (_append, lambda: {"losses": [], "counts": {"steps": 0}}),
    "a defaultdict's list": (_autovivify, lambda: collections.defaultdict(list)),
    "dict.setdefault": (_setdefault, dict),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lists_and_dicts_inside_the_step_s_state_keep_what_it_logs(case: str) -> None:
    (eager, eager_state), (step, state) = _make(*CASES[case]), _make(*CASES[case])
    traced = graphprof.trace(step)
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(CALLS):
            if i == 1 and case != "a list and a counter in a dict":
                state.clear()  # the first call is eager: let the capture call be the one making the key
                eager_state.clear()
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            assert torch.equal(eager(x, y), traced(x, y))
            assert repr(dict(state)) == repr(dict(eager_state)), f"after call {i}"
    values = state["losses"] if "losses" in state else state["loss"]
    assert all(type(v) is float for v in values) and len(values) >= CALLS - 1
    assert traced.capture_mode == "whole-step" and traced.captures <= 2


@pytest.mark.parametrize("made", ["dict", "list", "two levels"])
def test_a_new_container_of_logged_numbers_replacing_an_old_one_holds_each_calls_numbers(made: str) -> None:
    """``out["last"] = {"loss": loss.item()}`` every call: from the second call on, ``out["last"]`` held
    a dict, watched as an entry of its own, whose replacement was set again after the dict's update
    with the capture call's numbers. Every replay left the capture call's loss there, silently."""
    def make() -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], dict[str, Any]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out: dict[str, Any] = {}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            value = loss.item()
            out["last"] = ({"loss": value} if made == "dict" else [value] if made == "list"
                           else {"train": {"loss": value}})
            return loss.detach()
        return step, out

    results = []
    for traced in (False, True):
        step, out = make()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(5):
                g = torch.Generator().manual_seed(i)
                fn(torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g))
                seen.append(repr(out))
        if traced:
            assert fn.capture_mode == "whole-step" and fn.captures == 1
        results.append(seen)
    assert results[0] == results[1]
