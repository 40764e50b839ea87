"""Changes between calls that a captured graph holds baked in are noticed, and results stay eager's bitwise.

Each scenario builds a step twice from one seed, makes the same change to
both copies before some calls (a deep submodule to eval, a param_groups flag,
a new group, a tensor learning rate), and compares the eager and the traced
copy after every call: losses, parameters, gradients and optimizer state.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal

Change = Callable[[int, nn.Module, torch.optim.Optimizer], None]


def _model() -> nn.Module:
    inner = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Tanh(), nn.Dropout(0.5)))
    return nn.Sequential(nn.Linear(8, 8), inner, nn.Linear(8, 1))


def _run(change: Change, make_opt: Callable[[nn.Module], torch.optim.Optimizer], calls: int = 10) -> Any:
    copies = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _model()
        copies.append((model, make_opt(model)))

    def step_of(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    (model_a, opt_a), (model_b, opt_b) = copies
    eager, traced = step_of(model_a, opt_a), graphprof.trace(step_of(model_b, opt_b))
    for i in range(calls):
        change(i, model_a, opt_a)
        change(i, model_b, opt_b)
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        torch.manual_seed(100 + i)
        la = eager(x, y)
        torch.manual_seed(100 + i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lb = traced(x, y)
        where = f"after call {i}"
        assert torch.equal(la, lb), f"loss differs {where}"
        assert_modules_equal(model_a, model_b, where)
        sa, sb = opt_a.state_dict(), opt_b.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        for k, state in sa["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb["state"][k][key])), f"{key} {where}"
    return traced


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _deep_dropout(model: nn.Module) -> nn.Module:
    return model[1][1][1]


def test_a_deep_submodule_switched_to_eval_and_back() -> None:
    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if i in (4, 7):
            _deep_dropout(model).train(i == 7)

    fn = _run(change, _sgd)
    assert fn.captures == 2 and fn.capture_mode == "whole-step"  # the train graph is kept and taken again


def test_a_deep_flag_assigned_without_train() -> None:
    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if i == 4:
            _deep_dropout(model).training = False

    assert _run(change, _sgd).captures == 2


@pytest.mark.parametrize("key, value", [("nesterov", True), ("maximize", True), ("momentum", 0.0),
                                        ("weight_decay", 0.1), ("foreach", True), ("dampening", 0.5)])
def test_a_param_groups_value_changed_between_calls(key: str, value: Any) -> None:
    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if i == 4:
            opt.param_groups[0][key] = value

    fn = _run(change, _sgd)
    assert fn.captures == 2, key  # a flag is baked; a number a branch read is guarded


def test_a_param_group_added_between_calls() -> None:
    def make_opt(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model[0].parameters(), lr=0.05)

    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if i == 4:
            opt.add_param_group({"params": list(model[2].parameters()), "lr": 0.2})

    assert _run(change, make_opt).captures == 2


def test_a_learning_rate_replaced_by_a_tensor_and_then_by_another() -> None:
    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if i == 4:
            opt.param_groups[0]["lr"] = torch.tensor(0.02)
        if i == 6:
            opt.param_groups[0]["lr"].fill_(0.03)  # updated in place: the same graph reads it
        if i == 8:
            opt.param_groups[0]["lr"] = torch.tensor(0.01)

    fn = _run(change, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, foreach=False))
    # The float graph is not replayed with the tensor: the tensor is captured again (a graph that reads it
    # where SGD's argument parsing reads it, capture/parsed_numbers.py), filled in place it is read by the
    # same graph, and another tensor object is captured once more.
    assert fn.captures == 3 and fn.capture_mode == "whole-step"


def test_a_learning_rate_that_changes_value_and_type_is_read_at_run_time() -> None:
    def change(i: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.param_groups[0]["lr"] = 0.05 / (i + 1) if i % 3 else 1  # floats, and sometimes an int

    assert _run(change, _sgd).captures == 1


def test_signatures_alternating_beyond_the_cache_capture_again_and_stay_eager() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Tanh())

    def infer(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x)

    fn = graphprof.trace(infer, cache_size=1)
    for i, batch in enumerate([2, 2, 2, 3, 3, 2, 2, 3]):  # each switch evicts the other shape's graph
        x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(i))
        assert torch.equal(fn(x), infer(x))
    assert fn.captures == 4 and len(fn._paths.graphs) == 1
