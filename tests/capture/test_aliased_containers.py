"""A list of dicts the step reaches by two names: a closure's ``summ`` and a state dict's ``S["summ"]``.

knowledge-distillation-pytorch's ``train_kd`` appends a dict of metrics to
``summ`` every few steps, and a trainer's state dict commonly holds the same
list. The list was watched once per name, so the numbers of the dicts in it
were replaced by two inputs, the second over the first; when the capture
was then refused (formatting a loss for a progress bar), undoing it put the
first input back, and the user's list kept graphprof's objects in place of
their floats, which raised when printed. Each scenario runs an eager and a
traced copy and compares what the user keeps, types too, after every call.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import graphprof

CALLS = 5


def _make(alias: bool, formats: bool, appends_through: str, every: int = 2) -> tuple[Callable[..., Any], dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    summ: list[dict[str, Any]] = [{"loss": 0.5, "accuracy": np.float64(0.25)}]  # from earlier steps
    S: dict[str, Any] = {"i": 0, "postfix": None}
    if alias:
        S["summ"] = summ

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if S["i"] % every == 0:  # every ``save_summary_steps``
            (S["summ"] if appends_through == "state" else summ).append({"loss": loss.item()})
        if formats:
            S["postfix"] = "{:05.3f}".format(loss.item())  # refused: a replay could not format it
        S["i"] += 1
        return loss.detach()

    return step, {"S": S, "summ": summ}


def _kept(kept: dict[str, Any]) -> list[Any]:
    """What the user keeps, each number with its type (a float, a numpy float64)."""
    items = [(k, type(v), v) for d in kept["summ"] for k, v in d.items()]
    return [items, [(k, type(v), v) for k, v in kept["S"].items() if k != "summ"]]


@pytest.mark.parametrize("alias, appends_through", [(True, "closure"), (True, "state"), (False, "closure")])
def test_a_refused_capture_leaves_the_users_numbers_in_a_list_of_dicts(alias: bool, appends_through: str) -> None:
    """(No ``S["summ"]`` to append through without the alias.)"""
    eager, eager_kept = _make(alias, True, appends_through)
    step, kept = _make(alias, True, appends_through)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"result differs on call {i}"
            assert _kept(kept) == _kept(eager_kept), f"kept values differ after call {i}"
            assert str(kept["summ"]) == str(eager_kept["summ"]), f"printed values differ after call {i}"
    assert len([w for w in caught if str(w.message).startswith("graphprof")]) == 1


def test_a_list_of_dicts_reached_by_two_names_is_replayed_as_one() -> None:
    """Without the refusal: one graph, each replay appending once, the user's numbers as eager's."""
    eager, eager_kept = _make(True, False, "closure", every=1)
    step, kept = _make(True, False, "closure", every=1)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"result differs on call {i}"
            assert _kept(kept) == _kept(eager_kept), f"kept values differ after call {i}"
    assert not [w for w in caught if str(w.message).startswith("graphprof")]
    assert kept["S"]["summ"] is kept["summ"]
    # One graph: the list, watched twice, was also held by its contents, which changed on every call.
    assert traced.capture_mode == "whole-step" and traced.captures == 1


class _Meter:
    """A logger object kept in the step's state whose dict is also the step's own ``log``."""

    def __init__(self, log: dict[str, Any]) -> None:
        self.log = log


def _make_meter(formats: bool) -> tuple[Callable[..., Any], dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log: dict[str, Any] = {"best": 0.5, "hist": [0.25]}
    S: dict[str, Any] = {"meters": {"loss": _Meter(log)}, "postfix": None}

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log["hist"].append(loss.item())
        if formats:
            S["postfix"] = "{:05.3f}".format(loss.item())
        return loss.detach()

    return step, {"S": S, "log": log}


@pytest.mark.parametrize("formats", [True, False])
def test_a_dict_kept_by_an_object_in_the_state_and_by_a_name(formats: bool) -> None:
    """The object's field is watched where the step names the dict, once: after a refused capture the
    user's numbers are theirs, and a replay appends once."""
    eager, eager_kept = _make_meter(formats)
    step, kept = _make_meter(formats)
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"result differs on call {i}"
            log, eager_log = kept["log"], eager_kept["log"]
            assert type(log["best"]) is float and log["best"] == eager_log["best"], f"after call {i}"
            assert log["hist"] == eager_log["hist"] and all(type(v) is float for v in log["hist"]), f"after call {i}"
            assert kept["S"]["meters"]["loss"].log is log
    warned = [w for w in caught if str(w.message).startswith("graphprof")]
    assert len(warned) == (1 if formats else 0)
    if not formats:
        assert traced.capture_mode == "whole-step" and traced.captures == 1
