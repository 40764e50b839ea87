"""A step that differentiates a gradient again (an R1 or gradient penalty) run as segments.

AOTAutograd's compiled forward cannot be differentiated twice: the penalty's
backward raised "torch.compile with aot_autograd does not currently support
double backward" into the step, where eager ran. Found in the step's code
before anything compiles, its forwards run eagerly, with one warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.double_backward import double_backward_site


def _r1_penalty(pred: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """StyleGAN2's R1: a helper the step names, as in its training loops."""
    grad, = torch.autograd.grad(pred.sum(), real, create_graph=True)
    return grad.pow(2).sum(1).mean()


def _discriminator_step(every: int, branch: bool) -> tuple[nn.Module, Callable[[torch.Tensor, int], torch.Tensor]]:
    torch.manual_seed(0)
    disc = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    opt = torch.optim.Adam(disc.parameters(), lr=1e-3)

    def step(real: torch.Tensor, i: int) -> torch.Tensor:
        real.requires_grad_(i % every == 0)
        pred = disc(real)
        loss = F.softplus(-pred).mean()
        if i % every == 0:  # the lazy R1 of StyleGAN2: every ``every``-th call
            loss = loss + 5.0 * _r1_penalty(pred, real)
        if branch and loss > 1e6:  # a branch on the loss: refuses the whole-step capture
            print("diverged")
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return disc, step


@pytest.mark.parametrize("capture, every, branch", [("auto", 1, True), ("dynamo", 3, False)],
                         ids=["auto fallback, R1 every call", "dynamo, lazy R1 after the compiling call"])
def test_a_penalty_differentiating_a_gradient_runs_its_forward_eagerly(capture: str, every: int,
                                                                       branch: bool) -> None:
    (eager_model, eager), (model, step) = _discriminator_step(every, branch), _discriminator_step(every, branch)
    traced = graphprof.trace(step, capture=capture)
    messages: list[str] = []
    for i in range(7):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(x.clone(), i), traced(x.clone(), i)), f"loss differs on call {i}"
        messages += [str(w.message) for w in caught]
        for (name, a), (_, b) in zip(eager_model.named_parameters(), model.named_parameters()):
            assert torch.equal(a, b), f"{name} differs after call {i}"
    assert traced.capture_mode == "segments"
    uncompiled = [m for m in messages if "could not compile the forward of Sequential" in m]
    assert len(uncompiled) == 1 and "create_graph at" in uncompiled[0]
    assert len(messages) == (2 if capture == "auto" else 1)  # and the refusal's, in auto mode
    assert traced.get_profile() is not None


def _literal_false(loss: torch.Tensor, x: torch.Tensor) -> Any:
    return torch.autograd.grad(loss, x, retain_graph=True, create_graph=False)


def _chosen(loss: torch.Tensor, x: torch.Tensor, second_order: bool) -> Any:
    return torch.autograd.grad(loss, x, create_graph=True if second_order else False)


def test_only_a_create_graph_that_may_be_true_is_a_double_backward() -> None:
    """``create_graph=False`` keeps the forwards compiled; a value decided at run time does not."""
    assert double_backward_site(_literal_false) is None
    assert double_backward_site(_chosen) is not None
    assert double_backward_site(lambda loss: loss.backward()) is None
