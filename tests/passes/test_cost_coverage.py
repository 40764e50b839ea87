"""Every op of the demo steps and of torch's optimizers has a formula; custom ops can get one."""

from __future__ import annotations

import collections
import logging

import pytest
import torch
from torch import nn

import graphprof
from graphprof.demo.steps import cnn_bn_dropout_step, gpt_adamw_step, mlp_sgd_step, resnet_sgd_step
from graphprof.passes.cost import has_formula, unregister_cost
from graphprof.passes.cost_formulas import MISSING_OPS, CostRecord, OpCall, cost
from graphprof.profile.model import Phase
from tests.passes.cost_helpers import capture_demo, capture_step, costed, costs_of, only, total_flops

DEMOS = {"resnet": resnet_sgd_step, "gpt": gpt_adamw_step, "cnn": cnn_bn_dropout_step, "mlp": mlp_sgd_step}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_every_op_type_of_the_demo_steps_has_a_formula(name: str) -> None:
    """Timing-independent form of the time-coverage target: no op type without a formula
    (views and getitem are deliberately free and count as covered)."""
    nodes = costed(capture_demo(DEMOS[name]()))  # default sizes
    assert len({c.node.target for c in nodes}) > 10
    assert sorted({c.ann.op for c in nodes if not has_formula(c.node.target)}) == []
    assert [c.ann.op for c in nodes if c.cost.flops is None] == []
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= {c.ann.phase for c in nodes if c.cost.flops}


def test_every_name_in_the_formula_tables_is_an_op_of_this_torch() -> None:
    assert MISSING_OPS == set()


def _optimizer_flops(make_opt) -> tuple[int, list[str]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    opt = make_opt(model.parameters())

    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    nodes = [c for c in costed(capture_step(step, torch.randn(6, 5))) if c.ann.phase is Phase.OPTIMIZER]
    assert all(c.cost.flops is not None for c in nodes)
    return total_flops(c for c in nodes if c.ann.op.startswith("aten.")), sorted({c.ann.type for c in nodes})


@pytest.mark.parametrize("optimizer, options", [
    (torch.optim.Adam, dict(lr=1e-3)),
    (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
])
def test_for_loop_foreach_and_fused_optimizers_count_the_same_flops(optimizer, options) -> None:
    loop, loop_ops = _optimizer_flops(lambda p: optimizer(p, foreach=False, **options))
    foreach, foreach_ops = _optimizer_flops(lambda p: optimizer(p, foreach=True, **options))
    fused, fused_ops = _optimizer_flops(lambda p: optimizer(p, fused=True, **options))
    assert any(t.startswith("_foreach_") for t in foreach_ops)
    assert any(t.startswith("_fused_") for t in fused_ops)
    assert loop > 0 and loop == foreach == fused


def _define_custom_ops() -> None:
    if hasattr(torch.ops, "graphprof_test") and hasattr(torch.ops.graphprof_test, "twice"):
        return

    @torch.library.custom_op("graphprof_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    @torch.library.custom_op("graphprof_test::outer", mutates_args=())
    def outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[:, None] * b[None, :]

    @outer.register_fake
    def _(a, b):
        return a.new_empty(a.shape[0], b.shape[0])

    @torch.utils.flop_counter.register_flop_formula(torch.ops.graphprof_test.outer)
    def _(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return a_shape[0] * b_shape[0]


def test_an_op_without_formula_gets_none_and_register_cost_gives_it_one() -> None:
    _define_custom_ops()
    op = torch.ops.graphprof_test.twice.default
    x = torch.randn(3, 4)
    missing = only(costs_of(lambda t: torch.ops.graphprof_test.twice(t), x), "twice").cost
    assert missing.flops is None  # never a silent 0
    assert (missing.bytes_read, missing.bytes_written) == (48, 48)  # bytes still follow the default rule
    try:
        graphprof.register_cost(op, lambda call: call.out_numel)  # an int: FLOPs, default bytes
        assert only(costs_of(lambda t: torch.ops.graphprof_test.twice(t), x), "twice").cost == CostRecord(12, 48, 48)

        @graphprof.register_cost(torch.ops.graphprof_test.twice)  # a packet, as a decorator
        def _full(call: OpCall) -> CostRecord:
            return cost(call, 7, bytes_read=1, bytes_written=2)

        unregister_cost(op)  # the overload's formula went first; now the packet's applies
        assert only(costs_of(lambda t: torch.ops.graphprof_test.twice(t), x), "twice").cost == CostRecord(7, 1, 2)
    finally:
        unregister_cost(op)
        unregister_cost(torch.ops.graphprof_test.twice)
    assert only(costs_of(lambda t: torch.ops.graphprof_test.twice(t), x), "twice").cost.flops is None


def test_user_formulas_override_builtins_and_torch_registered_formulas_are_used() -> None:
    _define_custom_ops()
    a, b = torch.randn(3), torch.randn(5)
    assert only(costs_of(lambda u, v: torch.ops.graphprof_test.outer(u, v), a, b), "outer").cost.flops == 15
    relu = torch.ops.aten.relu.default
    try:
        graphprof.register_cost(relu, lambda call: 42)
        assert only(costs_of(torch.relu, a), "relu").cost.flops == 42
    finally:
        unregister_cost(relu)
    assert only(costs_of(torch.relu, a), "relu").cost.flops == 3
    with pytest.raises(TypeError):
        graphprof.register_cost("aten::relu", lambda call: 1)


def test_a_failing_formula_leaves_flops_unknown_with_a_warning(caplog) -> None:
    _define_custom_ops()
    op = torch.ops.graphprof_test.twice.default
    try:
        graphprof.register_cost(op, lambda call: 1 // 0)
        with caplog.at_level(logging.WARNING, logger="graphprof"):
            record = only(costs_of(lambda t: torch.ops.graphprof_test.twice(t), torch.randn(2)), "twice").cost
    finally:
        unregister_cost(op)
    assert record.flops is None and record.bytes_read == 8
    assert "graphprof_test.twice" in caplog.text and "ZeroDivisionError" in caplog.text


def test_formulas_count_per_produced_element() -> None:
    n = 20
    x, y = torch.randn(4, 5), torch.randn(5)
    counts = collections.Counter()
    for c in costs_of(lambda a, b: (torch.where(a > 0, a, b), a.clamp(-1, 1), torch.lerp(a, b, 0.3),
                                    torch.addcmul(a, a, b, value=0.5), torch.addcdiv(a, a, b), a.sigmoid()), x, y):
        counts[c.ann.type] += c.cost.flops
    assert counts == {"gt": n, "where": n, "clamp": 2 * n, "lerp": 3 * n, "addcmul": 3 * n, "addcdiv": 2 * n,
                      "sigmoid": 4 * n}
