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


class _MomentumEncoder(nn.Module):
    """MoCo v2's builder: a key encoder updated by ``.data =`` in the forward, a queue pointer read by ``int``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_q = nn.Linear(8, 4)
        self.encoder_k = nn.Linear(8, 4)
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", torch.randn(4, 12))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        q = self.encoder_q(im_q)
        with torch.no_grad():
            for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                pk.data = pk.data * 0.9 + pq.data * 0.1
            k = self.encoder_k(im_k)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone()], dim=1)
        ptr = int(self.queue_ptr)  # refuses the capture, after the assignments above ran
        self.queue[:, ptr:ptr + 4] = k.T
        self.queue_ptr[0] = (ptr + 4) % 12
        return logits


def _momentum_encoder() -> tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    model = _MomentumEncoder()
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03, momentum=0.9)

    def step(im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(im_q, im_k), torch.zeros(4, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def test_data_assigned_before_a_refusal_is_given_back() -> None:
    """A capture refused after ``pk.data = ...`` (MoCo: ``int(queue_ptr)`` later in the forward) left the
    new data in place, and the step's fallback run applied the momentum update a second time."""
    (eager_model, eager), (model, step) = _momentum_encoder(), _momentum_encoder()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal and the uncompiled forward say so once each
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            im_q, im_k = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
            assert torch.equal(eager(im_q, im_k), traced(im_q.clone(), im_k.clone())), f"loss differs on call {i}"
            for (name, a), (_, b) in zip(eager_model.state_dict().items(), model.state_dict().items()):
                assert torch.equal(a, b), f"{name} differs after call {i}"
    assert traced.capture_mode == "segments"
