"""Dropout in segments: no copy where eager skips it (p == 0, or not training), eager's ops in half precision on CPU.

Each step runs eagerly and under ``capture="dynamo"`` on identical copies
(same seed, so dropout masks match) and must agree bitwise; the forward
graphs must hold no ``clone`` where eager returned the input itself.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.fx
from torch import nn

import graphprof
from graphprof.capture.identity_dropout import drop_skipped_dropouts, eager_dropout, eager_skips
from graphprof.profile.model import GraphKind
from tests.helpers import assert_bitwise_against_eager


class _Net(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 2)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.a(x)))
        return self.b(nn.functional.dropout(h, p=self.drop.p, training=self.training))


def _run(p: float, train: bool) -> tuple[graphprof.trace, list[torch.Tensor], list[torch.Tensor]]:
    eager_model = _Net(p).train(train)
    seg_model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    seg_opt = torch.optim.SGD(seg_model.parameters(), lr=0.1)

    def make(model: nn.Module, opt: torch.optim.Optimizer):
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    eager, traced = make(eager_model, eager_opt), graphprof.trace(make(seg_model, seg_opt), capture="dynamo")
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(5):
            x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
            torch.manual_seed(100 + i)
            expected = eager(x, y)
            torch.manual_seed(100 + i)
            assert torch.equal(traced(x, y), expected)
    return traced, list(eager_model.parameters()), list(seg_model.parameters())


def _forward_targets(traced: graphprof.trace) -> list[str]:
    (forward,) = [s for s in traced.runner.capture.segments if s.kind is GraphKind.FORWARD]
    return [str(n.target) for n in forward.graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("p, train", [(0.0, True), (0.5, False)], ids=["p=0 training", "p=0.5 eval"])
def test_dropout_eager_skips_makes_no_copy_and_stays_bitwise(p: float, train: bool) -> None:
    traced, eager_params, seg_params = _run(p, train)
    targets = _forward_targets(traced)
    assert not any("clone" in t or "dropout" in t for t in targets)
    for a, b in zip(eager_params, seg_params):
        assert torch.equal(a, b)


def test_dropout_that_runs_is_left_to_aot_autograd_and_stays_bitwise() -> None:
    traced, eager_params, seg_params = _run(0.5, True)
    assert any("native_dropout" in t for t in _forward_targets(traced))
    for a, b in zip(eager_params, seg_params):
        assert torch.equal(a, b)


def _call(target, *args, **kwargs) -> torch.fx.Node:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    return graph.call_function(target, (x, *args), kwargs)


def test_only_constant_skipped_dropouts_are_replaced() -> None:
    F = nn.functional
    assert eager_skips(_call(F.dropout, 0.0, True, False))
    assert eager_skips(_call(F.dropout, 0.3, False))
    assert eager_skips(_call(F.dropout, p=0.0))
    assert eager_skips(_call(torch.dropout, 0.7, False))
    assert not eager_skips(_call(F.dropout))  # default p=0.5, training
    assert not eager_skips(_call(F.dropout, 0.1, True))
    assert not eager_skips(_call(F.dropout, 1.5, False))  # eager raises: left alone
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    p = graph.placeholder("p")
    assert not eager_skips(graph.call_function(F.dropout, (x, p, False)))  # p known only at run time
    run_time_p = graph.call_function(F.dropout, (x,), {"p": p, "training": True})
    assert not eager_skips(run_time_p)


def test_replacing_returns_the_input_itself() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(nn.functional.dropout, (x, 0.0, True, False)))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    assert drop_skipped_dropouts(gm) == 1
    t = torch.randn(3)
    assert gm(t) is t  # as eager's F.dropout(t, 0.0) returns t


@pytest.mark.parametrize("precision", ["autocast", "bf16-model", "fp16-model"])
def test_half_precision_dropout_rounds_as_eager_in_segments(precision: str) -> None:
    """Eager scales CPU dropout's noise in the input's dtype (1.109375 for p = 0.1 in bfloat16);
    AOTAutograd's ``native_dropout`` scaled in float: a bf16 bit away from eager's gradients."""
    def make() -> tuple[nn.Module, object]:
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 4))
        if precision != "autocast":
            model = model.to(torch.bfloat16 if precision == "bf16-model" else torch.float16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dtype = next(model.parameters()).dtype

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
                loss = nn.functional.mse_loss(model(x.to(dtype)).float(), y)
            if not torch.isfinite(loss):  # a branch on a tensor: the step falls back to segments
                return None
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    def inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one warning
        traced = assert_bitwise_against_eager(make, inputs, 4, profiling=True)
    assert traced.capture_mode == "segments"


def test_eager_dropout_is_eagers_own_ops() -> None:
    x = torch.randn(64, dtype=torch.bfloat16)
    for p, training in [(0.1, True), (0.0, True), (0.3, False), (1.0, True)]:
        torch.manual_seed(3)
        expected = nn.functional.dropout(x, p, training)
        torch.manual_seed(3)
        assert torch.equal(eager_dropout(x, p, training), expected)
