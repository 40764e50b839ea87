"""A segmented step whose parameters carry gradient hooks runs eagerly while they are registered
(capture/gradient_hooks.py): torch.compile's backward ran them in another order than eager.

Each case runs a step eagerly and traced on identical copies and compares
everything bitwise after every call, the hooks' log included, and the warnings.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


def _make(hooked: int, item: bool) -> tuple[nn.Module, Any, list]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log: list[Any] = []
    for name, parameter in list(model.named_parameters())[:hooked]:
        if item:
            parameter.register_hook(lambda g, name=name: log.append((name, g.norm().item())))
        else:
            parameter.register_hook(lambda g, name=name: log.append(name))

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        random.random()  # a Python draw: not one static graph
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step, log


def _run(hooked: int, item: bool, **options: Any) -> tuple[list[str], Any]:
    """The traced calls' warnings and the traced function, after comparing every call with eager's."""
    torch.manual_seed(0)
    eager_model, eager_step, eager_log = _make(hooked, item)
    torch.manual_seed(0)
    traced_model, step, traced_log = _make(hooked, item)
    traced = graphprof.trace(step, **options)
    g = torch.Generator().manual_seed(1)
    messages = []
    for i in range(5):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
        random.seed(i)
        loss = eager_step(x, y)
        random.seed(i)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(loss, traced(x, y)), f"loss differs at call {i}"
        messages += [str(w.message) for w in caught]
        assert traced_log == eager_log, f"the hooks' log differs after call {i}"
        assert_modules_equal(eager_model, traced_model, f"after call {i}")
    return messages, traced


def test_hooks_logging_gradient_norms_run_in_eagers_order() -> None:
    """``p.register_hook(lambda g: log.append((name, g.norm().item())))`` on every parameter, a step
    that falls back: eager's ``2.bias, 2.weight, 0.bias, 0.weight``, where segments logged
    ``0.weight, 2.weight, 0.bias, 2.bias``. The one warning says why the step runs eagerly."""
    messages, traced = _run(4, item=True)
    assert len(messages) == 1, messages
    assert "random.random" in messages[0] and "it runs eagerly, unprofiled" in messages[0], messages
    assert "gradient hooks are registered (0.weight, 0.bias, 2.weight, 2.bias)" in messages[0], messages


def test_hooks_in_segments_the_user_asked_for_warn_once() -> None:
    """With ``capture="dynamo"`` nothing warned before: segments give the one warning themselves."""
    messages, traced = _run(2, item=False, capture="dynamo")
    assert len(messages) == 1 and "gradient hooks are registered (0.weight, 0.bias)" in messages[0], messages


def test_one_hooked_parameter_keeps_segments() -> None:
    """One hook has no order to change: the step is profiled as segments, with the fallback's warning only."""
    messages, traced = _run(1, item=True)
    assert len(messages) == 1 and "gradient hooks" not in messages[0], messages
    assert traced.capture_mode == "segments"
