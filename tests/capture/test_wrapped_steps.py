"""A step called through a wrapper (``def call(batch): return step(**batch)``).

The model, optimizer and Python state live in the wrapped function's closure:
they are the step's state too (capture/state.py, capture/inputs.py), or the
graph would be recaptured on every call (gradients look new) and a counter
kept there would be frozen at the capture call's value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


def _make() -> tuple[nn.Module, Any, dict]:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    stats = {"calls": 0}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        stats["calls"] += 1
        return loss

    def call(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return step(**batch)

    return model, call, stats


def test_wrapped_step_is_captured_once_and_its_counter_keeps_counting() -> None:
    torch.manual_seed(0)
    eager_model, eager_step, eager_stats = _make()
    torch.manual_seed(0)
    model, step, stats = _make()
    traced = graphprof.trace(step)
    for i in range(6):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager_step({"x": x}), traced({"x": x}))
        assert_modules_equal(eager_model, model, f"after call {i}")
    assert stats == eager_stats == {"calls": 6}
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1
    names = {n.module for n in traced.get_profile().graphs[0].nodes if n.type == "addmm"}
    assert names == {"0", "2"}  # the model was found: its own module paths


def test_a_partial_binding_the_model_and_a_config_replays_and_counts() -> None:
    """``functools.partial(body, model=model, opt=opt, cfg=cfg)``: what it binds was not the step's, so it
    captured on every call (gradients looked new) and fell back to segments after five."""
    import functools
    import warnings

    def body(x: torch.Tensor, model: nn.Module, opt: Any, cfg: dict) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean() * cfg["scale"]
        loss.backward()
        opt.step()
        cfg["calls"] += 1
        return loss.detach()

    def make() -> tuple[nn.Module, Any, dict]:
        torch.manual_seed(0)
        model, _, _ = _make()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        cfg = {"scale": 1.0, "calls": 0}
        return model, functools.partial(body, model=model, opt=opt, cfg=cfg), cfg

    (eager_model, eager, eager_cfg), (model, step, cfg) = make(), make()
    traced = graphprof.trace(step)
    g = torch.Generator().manual_seed(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(6):
            if i == 3:
                eager_cfg["scale"] = cfg["scale"] = 0.5
            x = torch.randn(4, 8, generator=g)
            assert torch.equal(eager(x), traced(x))
            assert_modules_equal(eager_model, model, f"after call {i}")
    assert cfg == eager_cfg and cfg["calls"] == 6
    # One graph for every scale: autograd saves it for the backward of a product, which uses it as it is,
    # so the backward reads it at run time too (capture/saved_numbers.py).
    assert traced.capture_mode == "whole-step" and traced.captures == 1


_CALLS = 12

def test_state_bound_as_default_arguments_counts_and_logs_on_every_call() -> None:
    """``def step(x, counter=counter, log=log)`` binds state the loop-safe way; it was never watched,
    so a replay neither counted nor logged (the counter stayed at the capture call's 2)."""
    runs = []
    for traced in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        counter: dict[str, int] = {"n": 0}
        log: list[float] = []

        def step(x: torch.Tensor, model: nn.Module = model, counter: dict = counter,
                 log: list = log) -> torch.Tensor:
            counter["n"] += 1
            out = model(x).sum()
            if counter["n"] % 2 == 0:
                log.append(out.item())
            return out.detach()

        fn = graphprof.trace(step) if traced else step
        losses = [fn(torch.full((3, 4), float(i))) for i in range(_CALLS)]
        runs.append((losses, dict(counter), list(log), fn))
    (losses_a, counter_a, log_a, _), (losses_b, counter_b, log_b, fn) = runs
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert counter_a == counter_b == {"n": _CALLS}
    assert log_a == log_b and len(log_b) == _CALLS // 2
    assert fn.capture_mode == "whole-step" and fn.captures == 2
