"""Custom autograd Functions: bitwise replay, backward ops attributed to the application."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.helpers import assert_bitwise_against_eager


class _ScaledTanh(torch.autograd.Function):
    """Old style: forward takes ctx; two ops forward, five backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return torch.tanh(x) * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        t = torch.tanh(x)
        return grad * w * (1 - t * t), (grad * t).sum(0)


class _Double(torch.autograd.Function):
    """New style (setup_context); its forward is a single view."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class _Act(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Double.apply(_ScaledTanh.apply(x, self.w))


def _make() -> tuple[nn.Module, Any]:
    model = nn.Sequential(nn.Linear(8, 8), _Act(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = _Double.apply(model(x)).pow(2).mean()  # applied outside any module
        loss.backward()
        opt.step()
        return loss

    return model, step


def _inputs(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(i)),)


def test_custom_function_backward_is_attributed_to_the_module_that_applied_it() -> None:
    traced = assert_bitwise_against_eager(_make, _inputs, 5, profiling=True)
    assert traced.capture_mode == "whole-step"
    nodes = [n for g in traced.get_profile().graphs for n in g.nodes]
    backward = [n for n in nodes if n.phase == "backward" and n.type in ("tanh", "rsub", "mul")]
    act = [n for n in backward if n.module == "1"]
    # tanh, rsub and four muls of _ScaledTanh.backward, one mul of _Double.backward
    assert [n.type for n in act].count("tanh") == 1 and [n.type for n in act].count("mul") >= 5
    assert all(n.module_type == "_Act" for n in act)
    assert all(n.source.endswith(f":{_Act.forward.__code__.co_firstlineno + 1}") for n in act)
    outside = [n for n in backward if n.module == ""]
    assert len(outside) >= 1 and all("test_custom_functions.py" in n.source for n in outside)


def test_ops_of_a_function_applied_outside_modules_are_forward_ops() -> None:
    traced = assert_bitwise_against_eager(_make, _inputs, 5, profiling=True)
    nodes = [n for g in traced.get_profile().graphs for n in g.nodes]
    views = [n for n in nodes if n.type == "view" and n.phase != "backward" and n.module == ""]
    assert views and all(n.phase == "forward" for n in views)
