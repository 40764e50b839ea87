"""Hugging Face models and a logging loop on an accelerator: the replay equals eager, dropout included.

The CPU conformance suite (tests/conformance) shows bitwise equality on the
CPU. On a device the question is different: dropout draws from the device's
generator (Philox), so a capture that recorded dropout as another op than
eager's would draw other masks, and checkpointed recomputation must draw the
same masks again. Each architecture is built twice from one seed, moved to the
device, and trained eagerly and traced; after every call the losses, the
models (parameters, buffers, gradients) and both generators' states are equal.
They ran on an NVIDIA H200 (torch 2.11, CUDA 13, transformers 5.17) on
2026-11-27 and passed, checkpointed GPT-2 with dropout included.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import graphprof
from tests.helpers import assert_modules_equal
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR

STEPS = 4


def _to_device(tree: Any) -> Any:
    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(accelerator()), tree)


def _device_rng() -> torch.Tensor:
    return torch.get_device_module(accelerator().type).get_rng_state()


def _compare(make: Any, inputs: Any, calls: int) -> Any:
    """Run two copies built by ``make()`` on the device, one eagerly and one traced; compare after every call."""
    pairs = []
    for _ in range(2):
        torch.manual_seed(0)
        model, step = make()
        model.to(accelerator())  # before the optimizer's first step: its state is empty, parameters keep identity
        pairs.append((model, step))
    (model_a, step_a), (model_b, step_b) = pairs
    traced = graphprof.trace(step_b, profiling=True)
    for i in range(calls):
        args = _to_device(inputs(i))
        torch.manual_seed(1000 + i)
        out_a = step_a(*args)
        rng_a, device_rng_a = torch.get_rng_state(), _device_rng()
        torch.manual_seed(1000 + i)
        out_b = traced(*args)
        where = f"after call {i}"
        assert torch.equal(torch.get_rng_state(), rng_a), f"CPU RNG state differs {where}"
        assert torch.equal(_device_rng(), device_rng_a), f"device RNG state differs {where}"
        for x, y in zip(torch.utils._pytree.tree_leaves(out_a), torch.utils._pytree.tree_leaves(out_b)):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y)), f"result differs {where}"
        assert_modules_equal(model_a, model_b, where)
    return traced


def _eager_and_traced(make: Any) -> list[tuple[Any, Any, Any]]:
    """Two copies from ``make()`` -> (model, step, what to observe), built from one seed and moved to
    the device: the first steps eagerly, the second traced."""
    sides = []
    for traced_side in (False, True):
        torch.manual_seed(0)
        model, step, observed = make()
        model.to(accelerator())
        sides.append((model, graphprof.trace(step) if traced_side else step, observed))
    return sides


def _architectures() -> list[Any]:
    pytest.importorskip("transformers")
    from tests.conformance.models import ARCHITECTURES

    return list(ARCHITECTURES)


@pytest.mark.parametrize("name", ["llama", "bert", "t5", "vit", "gpt2-checkpointed"])
def test_hugging_face_training_steps_on_the_device_equal_eager(name: str) -> None:
    from tests.conformance.models import build

    arch = next(a for a in _architectures() if a.name == name)
    traced = _compare(lambda: build(arch), arch.inputs, STEPS)
    assert traced.capture_mode == "whole-step"
    profile = traced.get_profile()
    assert profile.meta.device_type == accelerator().type
    assert {"forward", "backward", "optimizer"} <= {n.phase for g in profile.graphs for n in g.nodes}


def test_a_log_appended_every_third_call_on_the_device_equals_eager() -> None:
    """The step appends ``loss.item()`` to a list in its closure on some calls: the list and the model match eager."""

    def make() -> tuple[torch.nn.Module, Any, list[float]]:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        history: list[float] = []
        count = 0

        def step(x: torch.Tensor) -> torch.Tensor:
            nonlocal count
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            count += 1
            if count % 3 == 0:
                history.append(loss.item())
            return loss

        return model, step, history

    def inputs(i: int) -> tuple[torch.Tensor]:
        return (torch.randn(8, 16, generator=torch.Generator().manual_seed(i)),)

    (model_a, step_a, history_a), (model_b, traced, history_b) = _eager_and_traced(make)
    for i in range(9):
        torch.manual_seed(i)
        step_a(*_to_device(inputs(i)))
        torch.manual_seed(i)
        traced(*_to_device(inputs(i)))
        assert history_a == history_b, f"history differs after call {i}"
        assert_modules_equal(model_a, model_b, f"after call {i}")
    assert len(history_b) == 3


class _AverageMeter:
    def __init__(self) -> None:
        self.sum = 0.0
        self.count = 0
        self.avg = 0.0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n
        self.avg = self.sum / self.count


@pytest.mark.parametrize("moving_average", [False, True], ids=["meters", "moving average"])
def test_meters_and_a_moving_average_on_the_device_equal_eager(moving_average: bool) -> None:
    """A dict of meters is replayed whole-step; a moving average over a list the step appends to is
    refused (segments, one warning): both equal eager, call by call."""
    import warnings

    def make() -> tuple[torch.nn.Module, Any, Any]:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        meters = {"loss": _AverageMeter()}
        window: list[float] = []

        def step(x: torch.Tensor) -> Any:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            meters["loss"].update(loss.item(), x.size(0))
            if moving_average:
                window.append(loss.item())
                return sum(window[-3:]) / len(window[-3:])
            return loss.detach()

        return model, step, lambda: (vars(meters["loss"]).copy(), list(window))

    (model_a, step_a, seen_a), (model_b, traced, seen_b) = _eager_and_traced(make)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i)).to(accelerator())
            a, b = step_a(x), traced(x)
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), f"result differs after call {i}"
            assert seen_a() == seen_b(), f"meters or window differ after call {i}"
            assert_modules_equal(model_a, model_b, f"after call {i}")
    assert traced.capture_mode == ("segments" if moving_average else "whole-step")
    assert sum("a list it also appends to" in str(w.message) for w in caught) == (1 if moving_average else 0)
