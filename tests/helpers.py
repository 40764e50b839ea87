"""Shared helpers: run a demo step eagerly and traced, compare everything."""

from __future__ import annotations

from typing import Any

import torch

import graphprof
from graphprof.demo.steps import DemoStep


def run_eager(demo: DemoStep, steps: int, seed: int = 1234) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [demo.step_fn(*demo.make_inputs(i)).detach().clone() for i in range(steps)]


def run_traced(demo: DemoStep, steps: int, seed: int = 1234, **options: Any) -> tuple[list[torch.Tensor], Any]:
    torch.manual_seed(seed)
    fn = graphprof.trace(demo.step_fn, **options)
    return [fn(*demo.make_inputs(i)).detach().clone() for i in range(steps)], fn


def assert_same_state(a: DemoStep, b: DemoStep) -> None:
    """Parameters, buffers, gradients and optimizer state are bitwise equal."""
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), f"state {name} differs"
    for (name, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert (p.grad is None) == (q.grad is None), f"grad of {name}: one is None"
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"grad of {name} differs"
    if a.optimizer is not None:
        sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for k in sa:
            for key, value in sa[k].items():
                other = sb[k][key]
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, other), f"optimizer state {k}.{key} differs"
                else:
                    assert value == other
