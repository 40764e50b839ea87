"""Lists and dicts the step is given and changes: the caller's own objects change as in eager.

The capture calls the step with containers rebuilt from the flattened
arguments, so ``labels = batch.pop("labels")``, ``batch["x"] = ...`` or a
counter in a dict argument changed the rebuilt ones: the caller's batch
kept its labels and the counter never moved, in the capture call and every
replay, silently.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


def _batch(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    return {"x": torch.randn(4, 6, generator=g), "labels": torch.randn(4, 1, generator=g),
            "meta": {"seen": 0, "tags": ["raw"]}}


def _pop(model: nn.Module, batch: dict) -> torch.Tensor:
    labels = batch.pop("labels")
    return F.mse_loss(model(batch["x"]), labels)


def _move(model: nn.Module, batch: dict) -> torch.Tensor:
    batch["target"] = batch.pop("labels")  # an item the call was given, under another key
    return F.mse_loss(model(batch["x"]), batch["target"])


def _nested(model: nn.Module, batch: dict) -> torch.Tensor:
    batch["meta"]["seen"] += 1
    batch["meta"]["tags"].append("used")
    return F.mse_loss(model(batch["x"]), batch["labels"])


def _new_values(model: nn.Module, batch: dict) -> torch.Tensor:
    batch["x"] = batch["x"] * 0.5  # a tensor the step made
    batch["weight"] = torch.ones(4)  # a new key
    loss = F.mse_loss(model(batch["x"]), batch["labels"])
    batch["loss"] = loss.item()  # a number the replay computes
    return loss


STEPS: dict[str, Callable[[nn.Module, dict], torch.Tensor]] = {
    "pop": _pop, "move": _move, "nested": _nested, "new values": _new_values}


def _make(body: Callable[[nn.Module, dict], torch.Tensor]) -> tuple[nn.Module, Callable[[dict], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch: dict) -> torch.Tensor:
        loss = body(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_equal, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("kind", list(STEPS))
def test_a_step_s_changes_to_its_argument_reach_the_caller_s_dict(kind: str) -> None:
    (eager_model, eager), (model, step) = _make(STEPS[kind]), _make(STEPS[kind])
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(5):
            a, b = _batch(i), _batch(i)
            assert torch.equal(eager(a), traced(b)), f"loss differs on call {i}"
            assert _equal(a, b), f"the batch differs after call {i}: {sorted(a)} against {sorted(b)}"
            assert torch.equal(eager_model.weight, model.weight)
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_the_same_dict_given_every_call_keeps_counting() -> None:
    (_, eager), (_, step) = _make(_nested), _make(_nested)
    traced = graphprof.trace(step)
    a, b = _batch(0), _batch(0)
    inner_a, inner_b = a["meta"], b["meta"]
    for _ in range(4):
        eager(a)
        traced(b)
        b_tags = b["meta"]["tags"]
        assert _equal(a, b)
        b["meta"]["tags"] = ["raw"]  # the list's length is part of the signature: keep it
        a["meta"]["tags"] = ["raw"]
        assert b_tags[-1] == "used"
    assert b["meta"] is inner_b and a["meta"] is inner_a  # the caller's own inner dict, changed in place
    assert b["meta"]["seen"] == 4 and traced.captures == 1


def test_the_change_is_a_timed_host_node_of_the_profile() -> None:
    _, step = _make(_pop)
    traced = graphprof.trace(step, profiling=True)
    for i in range(4):
        traced(_batch(i))
    ops = [n.op for g in traced.get_profile().graphs for n in g.nodes]
    assert "host.update batch" in ops, ops


def test_a_refused_capture_leaves_the_caller_s_dict_to_the_fallback() -> None:
    """A step storing an object no replay could make is profiled as segments: it pops the labels once."""
    torch.manual_seed(0)
    model = nn.Linear(6, 1)

    def step(batch: dict) -> torch.Tensor:
        labels = batch.pop("labels")
        batch["model"] = model  # not a value a replay can reproduce
        return F.mse_loss(model(batch["x"]), labels).detach()

    traced = graphprof.trace(step)
    batches = [_batch(i) for i in range(3)]
    with pytest.warns(UserWarning, match="stores a Linear in batch"):
        for b in batches:
            traced(b)
    assert traced.capture_mode == "segments"
    assert all("labels" not in b and b["model"] is model for b in batches)


def test_an_input_made_to_require_grad_gets_its_flag_and_gradient_on_every_call() -> None:
    """An FGSM-style step: ``x.requires_grad_()``, a backward, then a step on ``x + eps * x.grad.sign()``."""
    def make() -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Linear(6, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            x.requires_grad_(True)
            F.mse_loss(model(x), y).backward()
            adversarial = (x + 0.1 * x.grad.sign()).detach()
            opt.zero_grad()
            loss = F.mse_loss(model(adversarial), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step)
    for i in range(5):
        batch = _batch(i)
        xa, xb = batch["x"], batch["x"].clone()
        assert torch.equal(eager(xa, batch["labels"]), traced(xb, batch["labels"]))
        assert xb.requires_grad and xb.grad is not None and torch.equal(xa.grad, xb.grad), f"call {i}"
        assert torch.equal(eager_model.weight, model.weight)
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_field_the_step_assigns_on_a_dataclass_batch_reaches_the_caller_s_object() -> None:
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        labels: torch.Tensor

    def scale(model: nn.Module, batch: Any) -> torch.Tensor:
        batch.x = batch.x * 0.5
        return F.mse_loss(model(batch.x), batch.labels)

    (_, eager), (_, step) = _make(scale), _make(scale)
    traced = graphprof.trace(step)
    for i in range(4):
        plain = _batch(i)
        a, b = Batch(plain["x"], plain["labels"]), Batch(plain["x"], plain["labels"])
        assert torch.equal(eager(a), traced(b))
        assert torch.equal(a.x, b.x) and b.x is not plain["x"], f"call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_inputs_that_require_grad_given_again_accumulate_into_their_own_gradients() -> None:
    """Three inputs given in turn: the first call of each makes its ``.grad``, later ones accumulate into
    it. A graph held the capture call's ``.grad`` as a constant, and one captured without a gradient
    replaced the one a later input had."""
    def make() -> Callable[[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(6, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    eager, traced = make(), graphprof.trace(make())
    xs = [_batch(i)["x"] for i in range(3)]
    mine, theirs = [x.clone().requires_grad_() for x in xs], [x.clone().requires_grad_() for x in xs]
    for i in range(9):
        assert torch.equal(eager(mine[i % 3]), traced(theirs[i % 3]))
        for a, b in zip(mine, theirs):
            assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad), f"after call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 2
