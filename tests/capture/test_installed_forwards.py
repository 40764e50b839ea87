"""Segments install compiled forwards through the class: copies and pickles of a module made in the step
behave as in eager (capture/installed_forwards.py).

Each case runs a step eagerly and traced on identical copies and compares
everything bitwise after every call, and after the loop what the step kept.
"""

from __future__ import annotations

import copy
import io
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.bn(self.fc1(x))))


class Doubled(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class Inherits(Net):
    pass


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(n)]


def _run(make: Any, calls: int, **options: Any) -> tuple[dict, dict, list[str]]:
    """(eager's kept values, traced's, the traced calls' warnings), models compared after every call."""
    torch.manual_seed(0)
    eager_model, eager_step, eager_kept = make()
    torch.manual_seed(0)
    traced_model, step, traced_kept = make()
    traced = graphprof.trace(step, **options)
    messages = []
    for i, (x, y) in enumerate(_batches(calls)):
        assert torch.equal(eager_step(x, y), _traced_call(traced, x, y, messages)), f"loss differs at call {i}"
        assert_modules_equal(eager_model, traced_model, f"after call {i}")
    return eager_kept, traced_kept, messages


def _traced_call(traced: Any, x: torch.Tensor, y: torch.Tensor, messages: list[str]) -> torch.Tensor:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = traced(x, y)
    messages += [str(w.message) for w in caught]
    return loss  # type: ignore[no-any-return]


def test_a_deep_copy_made_in_the_step_runs_as_itself_then_and_later() -> None:
    """A "best model" snapshot and an evaluated copy: each runs eagerly as its own module. The compiled
    forward put in ``model.__dict__`` went into the copies, which ran the live model: the original's
    BatchNorm statistics changed and the snapshot, evaluated after the loop, returned the live model's output."""
    def make() -> tuple[nn.Module, Any, dict]:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        kept: dict[str, Any] = {"i": 0, "outs": [], "own_forward": []}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept["own_forward"].append("forward" in vars(model))
            if kept["i"] % 2 == 1:
                kept["best"] = copy.deepcopy(model)
                with torch.no_grad():
                    kept["outs"].append(kept["best"](x))  # runs the copy's BatchNorm in training mode
            kept["i"] += 1
            return loss.detach()

        return model, step, kept

    eager, traced, messages = _run(make, 7)
    assert len(messages) == 1 and "deepcopy" in messages[0] and "torch.compile segments" in messages[0], messages
    assert all(torch.equal(a, b) for a, b in zip(eager["outs"], traced["outs"], strict=True))
    assert traced["own_forward"] == eager["own_forward"] == [False] * 7
    assert "forward" not in vars(traced["best"])
    assert_modules_equal(eager["best"], traced["best"], "in the snapshot")
    x = _batches(1)[0][0]
    for kept in (eager, traced):
        kept["best"].eval()
    with torch.no_grad():
        assert torch.equal(eager["best"](x), traced["best"](x))


def test_a_module_pickled_in_the_step_holds_nothing_of_graphprof() -> None:
    """``torch.save(model, f)`` and ``copy.copy(model)`` in a segmented step: the pickle loads as eager's,
    and the shallow copy has no forward of its own. Both failed: the compiled closure could not be pickled."""
    def make() -> tuple[nn.Module, Any, dict]:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        kept: dict[str, Any] = {"saved": [], "copies": []}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            buffer = io.BytesIO()
            torch.save(model, buffer)
            kept["saved"].append(buffer.getvalue())
            kept["copies"].append(copy.copy(model))
            return loss.detach()

        return model, step, kept

    eager, traced, messages = _run(make, 4)
    assert len(messages) == 1 and "torch.save" in messages[0] and "torch.compile segments" in messages[0], messages
    assert not any(b"graphprof" in data for data in traced["saved"])
    assert not any("forward" in vars(shallow) for shallow in traced["copies"])
    x = _batches(1)[0][0]
    for data_a, data_b in zip(eager["saved"], traced["saved"], strict=True):
        loaded_a = torch.load(io.BytesIO(data_a), weights_only=False).eval()
        loaded_b = torch.load(io.BytesIO(data_b), weights_only=False).eval()
        assert_modules_equal(loaded_a, loaded_b, "in a saved model")
        with torch.no_grad():
            assert torch.equal(loaded_a(x), loaded_b(x))


def test_subclasses_and_other_instances_run_their_own_forwards() -> None:
    """Two compiled modules of a class and its subclass (whose forward calls ``super().forward``), an
    uncompiled instance of each class and of a subclass with no forward of its own: every one runs as
    in eager, and the classes have their own attributes back after every call."""
    own = Net.__dict__["forward"], Doubled.__dict__["forward"]

    def make() -> tuple[nn.Module, Any, dict]:
        model, doubled, others = Net(), Doubled(), nn.ModuleList([Net(), Doubled(), Inherits()])
        everything = nn.ModuleList([model, doubled, others])
        opt = torch.optim.SGD(everything.parameters(), lr=0.05)
        kept: dict[str, Any] = {"outs": []}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x) + doubled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                kept["outs"].append([other(x) for other in others])
            return loss.detach()

        return everything, step, kept

    eager, traced, messages = _run(make, 4, capture="dynamo")
    assert messages == []
    for outs_a, outs_b in zip(eager["outs"], traced["outs"], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(outs_a, outs_b, strict=True))
    assert (Net.__dict__["forward"], Doubled.__dict__["forward"]) == own and "forward" not in vars(Inherits)
