"""BakedValues: the cheaper test of optimizer flags and module modes notices every change the full one does."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

from graphprof.capture.baked_values import BakedValues, guard_values
from graphprof.capture.state import StateIndex, discover_state


class _Setup:
    """A nested model with two optimizers (SGD with two groups, Adam), and their StateIndex."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Tanh(), nn.Sequential(nn.Dropout(0.1))),
                                   nn.Linear(4, 4), nn.Linear(4, 2))
        self.extra = nn.Parameter(torch.zeros(2))
        self.sgd = torch.optim.SGD([{"params": self.model[0].parameters()},
                                    {"params": self.model[2].parameters(), "lr": 0.5}], lr=0.1, momentum=0.9)
        self.adam = torch.optim.Adam(self.model[3].parameters(), lr=1e-3)
        model, sgd, adam = self.model, self.sgd, self.adam

        def step() -> None:
            _ = (model, sgd, adam)

        self.state: StateIndex = discover_state(step)
        assert len(self.state.optimizers) == 2 and len(self.state.modules) == 8


def _agrees(baked: BakedValues) -> str | None:
    """``changed()``, checked against the full comparison it shortcuts."""
    changed = baked.changed()
    assert (changed is None) == (guard_values(baked.state) == baked.values)
    return changed


def test_nothing_changed_passes_the_cheap_test_alone() -> None:
    s = _Setup()
    baked = BakedValues(s.state)
    assert baked._unchanged()  # the descriptive tuple is not built on the common call
    assert _agrees(baked) is None


def test_numbers_read_at_run_time_may_change_value_and_type() -> None:
    s = _Setup()
    baked = BakedValues(s.state)
    s.sgd.param_groups[0]["lr"] = 0.01  # a scheduler's new float: same type, cheap test passes
    s.adam.param_groups[0]["betas"] = (0.8, 0.99)
    assert baked._unchanged()  # the tuple goes through baked() itself and bakes the same
    assert _agrees(baked) is None
    s.sgd.param_groups[1]["lr"] = 1  # an int where a float was: the full comparison decides, and agrees
    s.adam.param_groups[0]["eps"] = np.float64(1e-7)
    assert not baked._unchanged()
    assert _agrees(baked) is None


MUTATIONS: dict[str, Callable[[_Setup], Any]] = {
    "deep submodule to eval": lambda s: s.model[1][1][0].eval(),
    "flag assigned directly": lambda s: setattr(s.model[1][0], "training", False),
    "whole model to eval": lambda s: s.model.eval(),
    "nesterov": lambda s: s.sgd.param_groups[0].__setitem__("nesterov", True),
    "maximize in the second group": lambda s: s.sgd.param_groups[1].__setitem__("maximize", True),
    "foreach None to False": lambda s: s.adam.param_groups[0].__setitem__("foreach", False),
    "amsgrad": lambda s: s.adam.param_groups[0].__setitem__("amsgrad", True),
    "lr replaced by a tensor": lambda s: s.sgd.param_groups[0].__setitem__("lr", torch.tensor(0.1)),
    "a bool in betas": lambda s: s.adam.param_groups[0].__setitem__("betas", (0.9, True)),
    "a key added": lambda s: s.sgd.param_groups[0].__setitem__("custom", "x"),
    "a key removed": lambda s: s.sgd.param_groups[0].pop("differentiable"),
    "a group added": lambda s: s.sgd.add_param_group({"params": [s.extra]}),
    "a group replaced by one with another flag": lambda s: s.sgd.param_groups.__setitem__(
        0, {**s.sgd.param_groups[0], "nesterov": True}),
    "a group dropped": lambda s: s.sgd.param_groups.pop(),
    "param_groups replaced": lambda s: setattr(s.adam, "param_groups", [{**s.adam.param_groups[0], "fused": True}]),
    "an object flag of another type": lambda s: s.sgd.param_groups[0].__setitem__("foreach", object()),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_every_change_is_noticed(name: str) -> None:
    s = _Setup()
    baked = BakedValues(s.state)
    MUTATIONS[name](s)
    assert _agrees(baked) is not None


def test_a_tensor_lr_updated_in_place_is_the_same_and_a_replaced_one_is_not() -> None:
    s = _Setup()
    lr = torch.tensor(0.1)
    s.sgd.param_groups[0]["lr"] = lr
    baked = BakedValues(s.state)
    lr.fill_(0.05)
    assert _agrees(baked) is None
    s.sgd.param_groups[0]["lr"] = torch.tensor(0.05)  # equal value, another tensor
    assert _agrees(baked) is not None


def test_a_group_replaced_by_an_equal_copy_needs_the_full_comparison_and_is_the_same() -> None:
    s = _Setup()
    baked = BakedValues(s.state)
    s.sgd.param_groups[0] = dict(s.sgd.param_groups[0])
    assert not baked._unchanged()
    assert _agrees(baked) is None


def test_a_dict_subclass_group_is_always_compared_in_full() -> None:
    class Group(dict):
        pass

    s = _Setup()
    s.sgd.param_groups[0] = Group(s.sgd.param_groups[0])
    baked = BakedValues(s.state)
    assert baked.group_tests is None and not baked._unchanged()
    assert _agrees(baked) is None
    s.sgd.param_groups[0]["nesterov"] = True
    assert _agrees(baked) is not None


def test_random_sequences_of_changes_agree_with_the_full_comparison() -> None:
    """Changes that matter and changes that do not, made and undone in random order."""
    rng = random.Random(0)
    s = _Setup()
    modules = list(s.model.modules())
    baked = BakedValues(s.state)
    groups = [g for opt in (s.sgd, s.adam) for g in opt.param_groups]
    captured = [dict(g) for g in groups]  # putting these back undoes a change
    values: list[Any] = [0.1, 1, True, False, None, "x", (0.9, 0.999), np.float64(0.1), torch.tensor(0.1)]
    answers = set()
    for _ in range(400):
        roll = rng.random()
        if roll < 0.15:  # undo everything
            s.model.train()
            for group, values_then in zip(groups, captured):
                group.update(values_then)
        elif roll < 0.5:
            rng.choice(modules).training = rng.random() < 0.8
        else:
            i = rng.randrange(len(groups))
            key = rng.choice([k for k in groups[i] if k != "params"])
            groups[i][key] = rng.choice(values) if rng.random() < 0.4 else captured[i][key]
        answers.add(_agrees(baked) is None)
    assert answers == {True, False}


def test_modes_mixed_at_capture_are_compared_module_by_module() -> None:
    s = _Setup()
    s.model[1][1][0].eval()  # a frozen submodule: the captured modes differ between modules
    baked = BakedValues(s.state)
    assert _agrees(baked) is None and baked._unchanged()
    s.model[1][1][0].train()
    assert _agrees(baked) is not None
    s.model[1][1][0].eval()
    s.model[2].eval()
    assert _agrees(baked) is not None
    s.model.eval()
    assert _agrees(baked) is not None
