"""What a step returns from ``torch.inference_mode()`` is an inference tensor after a replay too.

A replay returned a normal tensor with eager's values: ``is_inference()``
was False, and an in-place op on it outside the mode, which raises in
eager, went through.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphprof


def test_an_output_made_under_inference_mode_is_an_inference_tensor() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            probs = model(x).softmax(-1)
        return probs, x * 2  # the second one is made outside the mode

    traced = graphprof.trace(step)
    for i in range(4):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        (e_probs, e_double), (t_probs, t_double) = step(x), traced(x)
        assert torch.equal(e_probs, t_probs) and torch.equal(e_double, t_double), f"call {i}"
        assert t_probs.is_inference() and not t_double.is_inference(), f"call {i}"
        with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
            t_probs.add_(1)
    assert traced.capture_mode == "whole-step"
