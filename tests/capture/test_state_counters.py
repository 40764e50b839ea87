"""Branches on a counter the model or optimizer keeps as a tensor: ``AveragedModel.n_averaged``.

``torch.optim.swa_utils.AveragedModel.update_parameters`` asks ``n_averaged
== 0`` on every call (copy the weights the first time, average them after).
That is a read of the model's state, which a static graph cannot check
before it runs in general (it would run the forward again); a one-element
counter it can, as the call finds it. Such steps (EMA and SWA, common in
current training code) were profiled as segments; they are now one graph,
and a counter the user resets between calls selects the other branch.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import graphprof
from tests.helpers import assert_same_optimizer_loop, optimizer_loop


def _run(traced: bool, make_average: Callable[[nn.Module], AveragedModel], calls: int = 8,
         restart_at: int | None = None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    average = make_average(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        average.update_parameters(model)
        return loss.detach()

    run = graphprof.trace(step) if traced else step
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(calls):
        if i == restart_at:
            average.n_averaged.zero_()  # start averaging afresh: the next update copies the weights
        losses.append(run(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)))
    return losses, {k: v.clone() for k, v in average.state_dict().items()}, run


AVERAGES = {
    "swa": lambda model: AveragedModel(model),
    "ema": lambda model: AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9)),
}


@pytest.mark.parametrize("kind", sorted(AVERAGES))
@pytest.mark.parametrize("restart_at", [None, 4])
def test_an_averaged_model_is_updated_as_eager_updates_it_in_one_graph(kind: str, restart_at: int | None) -> None:
    eager_losses, eager_average, _ = _run(False, AVERAGES[kind], restart_at=restart_at)
    losses, average, run = _run(True, AVERAGES[kind], restart_at=restart_at)
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, losses))
    assert eager_average.keys() == average.keys()
    assert all(torch.equal(eager_average[k], average[k]) for k in average)
    assert run.capture_mode == "whole-step"
    # Captured once after the first (eager) update; a restart takes the copying branch once, and then
    # the averaging graph again, which is still held.
    assert run.captures == (1 if restart_at is None else 2)
    assert any("n_averaged" in guard for guard in run.get_profile().meta.extra.get("guards", []))


#: Optimizers that branch on their step count after advancing it (``step_t += 1``, then ``.item()``):
#: RAdam asks ``rho_t > 5.0`` (false for the first five steps), ASGD ``max(1, step - t0)``.
COUNTING = {
    "radam": lambda params: torch.optim.RAdam(params, lr=0.01),
    "radam-decoupled": lambda params: torch.optim.RAdam(params, lr=0.01, weight_decay=0.1,
                                                         decoupled_weight_decay=True),
    "asgd": lambda params: torch.optim.ASGD(params, lr=0.01, t0=3),
    # foreach: the counters advance in one ``_foreach_add_`` over the list, read back through other
    # get_attr nodes; the check advanced none of them, so each branch flipped one call late.
    "radam-foreach": lambda params: torch.optim.RAdam(params, lr=0.01, foreach=True),
    "asgd-foreach": lambda params: torch.optim.ASGD(params, lr=0.01, t0=3, foreach=True),
}


@pytest.mark.parametrize("name", sorted(COUNTING))
def test_an_optimizer_branching_on_its_advanced_step_count_is_one_graph_per_branch(name: str) -> None:
    """The check computes the count the step will read (as the call finds it, advanced on a copy) and
    guards the comparison's outcome, never the number: one path per branch, not one per step."""
    eager, _ = optimizer_loop(COUNTING[name], traced=False, calls=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal, no storm
        traced, run = optimizer_loop(COUNTING[name], traced=True, calls=12, profiling=True)
    assert_same_optimizer_loop(eager, traced)
    assert run.capture_mode == "whole-step"
    assert run.captures <= 3  # each branch once (ASGD: mu is read before and after t0)
    assert len(run.get_profile().steps) > 0
