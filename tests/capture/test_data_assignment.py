"""New data given to a parameter inside the step (``p.data = ...``, ``vector_to_parameters``).

The assignment is no op of the trace: a replay computed the new values and
dropped them, silently. Such a capture is refused, and the parameters get
their own data back before the step runs again another way.
"""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch
from torch import nn

import graphprof



def _data_assigning(kind: str) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        if kind == "vector_to_parameters":  # a hand-written update through a flat vector
            loss = model(x).pow(2).mean()
            grads = torch.autograd.grad(loss, list(model.parameters()))
            with torch.no_grad():
                flat = nn.utils.parameters_to_vector(model.parameters())
                nn.utils.vector_to_parameters(flat - 0.1 * torch.cat([g.flatten() for g in grads]),
                                              model.parameters())
        else:  # weight clipping by assigning new data after the optimizer
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            model.weight.data = model.weight.data.clamp(-0.02, 0.02)
        return loss.detach()
    return model, step


@pytest.mark.parametrize("kind", ["vector_to_parameters", ".data = clamp"])
def test_new_data_given_to_a_parameter_in_the_step_is_never_dropped(kind: str) -> None:
    """``p.data = ...`` is no op of the trace: a replay computed the new values and dropped them."""
    (eager_model, eager), (model, step) = _data_assigning(kind), _data_assigning(kind)
    traced = graphprof.trace(step)
    messages: list[str] = []
    for i in range(5):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) * (10 if i == 3 else 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(x), traced(x.clone())), f"loss differs on call {i}"
        messages += [str(w.message) for w in caught]
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "assigns new data to weight" in messages[0]
