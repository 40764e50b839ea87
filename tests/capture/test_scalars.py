"""Guards a replay checks: each distinct check once (capture/scalars.py ``distinct_guards``)."""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch import nn

import graphprof
from graphprof.capture.guards import distinct_guards
from graphprof.capture.scalars import Guard


def _graph_with_reads() -> tuple[torch.fx.Graph, torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()
    dampening = graph.call_function(lambda: 0.0, ())  # a read of the user's state
    other = graph.call_function(lambda: 0.0, ())
    return graph, dampening, other


def test_guards_on_equal_arithmetic_of_the_same_read_are_one() -> None:
    graph, dampening, other = _graph_with_reads()
    subs = [graph.call_function(operator.sub, (1, dampening)) for _ in range(3)]  # one node per parameter
    guards = [Guard(operator.eq, (s, 1), True, "optimizer.step") for s in subs]
    assert distinct_guards(guards) == (guards[0],)


def test_guards_that_may_differ_are_all_kept() -> None:
    graph, dampening, other = _graph_with_reads()
    kept = [
        Guard(operator.eq, (graph.call_function(operator.sub, (1, dampening)), 1), True, "a"),
        Guard(operator.eq, (graph.call_function(operator.sub, (1, other)), 1), True, "another read"),
        Guard(operator.eq, (graph.call_function(operator.sub, (dampening, 1)), 1), True, "operands swapped"),
        Guard(operator.eq, (graph.call_function(operator.add, (1, dampening)), 1), True, "another function"),
        Guard(operator.eq, (graph.call_function(operator.sub, (1, dampening)), True), True, "True is not 1"),
        Guard(operator.eq, (graph.call_function(operator.sub, (1, dampening)), 1), False, "another outcome"),
    ]
    # A call that is not plain arithmetic (it may read something else each time) is kept by identity.
    opaque = [graph.call_function(max, (dampening, 0.0)) for _ in range(2)]
    kept += [Guard(operator.eq, (n, 0.0), True, "not arithmetic") for n in opaque]
    assert distinct_guards(kept) == tuple(kept)


def test_a_resnet_style_sgd_step_checks_each_hyperparameter_once() -> None:
    """SGD with momentum and dampening asks ``1 - dampening == 1`` once per parameter at capture."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(6)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(2, 4)

    @graphprof.trace(profiling=False)
    def step(inp: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(inp).square().mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step(x)
    described = [g.describe() for g in step.runner.captured.guards]
    # momentum != 0 and weight_decay != 0, and 1 - dampening == 1 (asked for each of 12 parameters)
    assert len(described) == 3, described
    assert sum(d.startswith("eq(sub") for d in described) == 1, described


class _Settings:
    scale: float | int = 2.0


def _losses(traced: bool, calls: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if isinstance(_Settings.scale, float):  # the user's type test on a number the step reads
            loss = loss * _Settings.scale
        loss.backward()
        opt.step()
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    out = []
    for i in range(calls):
        _Settings.scale = 2.0 if i < 2 else 3  # an int from the third call on: another path
        out.append(fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i))))
    return out


def test_the_users_isinstance_of_a_number_it_reads_sees_the_numbers_type() -> None:
    """It saw graphprof's TracedScalar in the capture call: False where eager says True, silently."""
    eager, traced = _losses(False), _losses(True)
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))
