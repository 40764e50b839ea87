"""Matmul, convolution and attention FLOPs agree with torch.utils.flop_counter, and
the GPT step's matmul FLOPs match the analytic 6*T*W + 12*n_layer*n_ctx*d_model*T."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
import torch.utils.flop_counter as flop_counter
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphprof.demo.steps import gpt_adamw_step
from graphprof.passes.cost import op_call
from graphprof.profile.model import Phase
from tests.passes.cost_helpers import MATMUL_TYPES, CostedNode, capture_demo, capture_step, costed, total_flops

aten = torch.ops.aten
SMALL_GPT = dict(batch_size=2, seq_len=16, n_ctx=16, d_model=32, n_layer=2, n_head=2)
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu.default,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward.default}


def _real(value: Any) -> Any:
    """A real tensor with a FakeTensor's shape, stride and dtype (values do not matter to FLOPs)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()
    return value


def _counted(fn: Any, *args: Any, **kwargs: Any) -> int:
    with FlopCounterMode(display=False) as mode:
        fn(*args, **kwargs)
    return mode.get_total_flops()


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _attention_reference(c: CostedNode, call: Any) -> int:
    """FlopCounterMode has no formula for the CPU flash kernel (it counts 0), so the
    reference is FlopCounterMode on the equivalent registered kernel, on meta tensors."""
    if c.node.target is aten._scaled_dot_product_flash_attention_for_cpu.default:
        q, k, v = (_meta(t) for t in call.args[:3])
        return _counted(aten._scaled_dot_product_efficient_attention, q, k, v, None, False)
    grad_out, q, k, v = (_meta(t) for t in call.args[:4])
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    return _counted(aten._scaled_dot_product_efficient_attention_backward, grad_out, q, k, v, None, out, lse,
                    seed, offset, 0.0, [True, True, True, False], False)


def _grouped_conv_backward_reference(args: list[Any]) -> int:
    """A grouped convolution is ``groups`` independent ones: FlopCounterMode on each, summed."""
    grad_out, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = args
    total = 0
    for g_i, x_i, w_i in zip(grad_out.chunk(groups, 1), x.chunk(groups, 1), w.chunk(groups, 0)):
        total += _counted(aten.convolution_backward, g_i, x_i, w_i, None, stride, padding, dilation, transposed,
                          output_padding, 1, mask)
    return total


def _reference(c: CostedNode, gm: torch.fx.GraphModule) -> int:
    call = op_call(c.node, gm)
    if c.node.target in CPU_ATTENTION:
        return _attention_reference(c, call)
    args = pytree.tree_map(_real, list(call.args))
    kwargs = pytree.tree_map(_real, dict(call.kwargs))
    if c.node.target is aten.convolution_backward.default and call.arg("groups") > 1:
        return _grouped_conv_backward_reference(args)
    return _counted(c.node.target, *args, **kwargs)


def _counted_by_torch(c: CostedNode) -> bool:
    target = c.node.target
    return target in CPU_ATTENTION or getattr(target, "overloadpacket", None) in flop_counter.flop_registry


def _conv_attention_step() -> tuple[Any, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    qkv = nn.Linear(8, 24)
    conv = nn.Conv2d(4, 8, kernel_size=3, stride=2, padding=1, groups=2)
    deconv = nn.ConvTranspose2d(8, 4, kernel_size=3, stride=2, padding=1, groups=4)
    plain = nn.Conv1d(3, 5, kernel_size=2, dilation=2)
    params = [p for m in (qkv, conv, deconv, plain) for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)

    def step(tokens, image, signal):
        opt.zero_grad()
        q, k, v = qkv(tokens).view(2, 16, 3, 2, 4).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        loss = attn.square().mean() + deconv(conv(image)).mean() + plain(signal).mean()
        loss.backward()
        opt.step()
        return loss

    inputs = (torch.randn(2, 16, 8), torch.randn(2, 4, 9, 9, requires_grad=True), torch.randn(2, 3, 10))
    return step, inputs


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, torch.fx.GraphModule]:
    demo = gpt_adamw_step(**SMALL_GPT)
    return demo, capture_demo(demo)


@pytest.fixture(scope="module")
def graphs(gpt) -> list[torch.fx.GraphModule]:
    step, inputs = _conv_attention_step()
    return [gpt[1], capture_step(step, *inputs)]


def test_every_matmul_conv_and_attention_node_matches_flop_counter(graphs) -> None:
    checked = collections.Counter()
    for gm in graphs:
        for c in costed(gm):
            if not _counted_by_torch(c):
                continue
            assert c.cost.flops == _reference(c, gm), f"{c.ann.op} {[t.shape for t in c.ann.in_tensors]}"
            checked[(c.ann.type, c.ann.phase)] += 1
    for op_type in ("mm", "addmm", "bmm", "convolution", "_scaled_dot_product_flash_attention_for_cpu"):
        assert checked[(op_type, Phase.FORWARD)] or checked[(op_type, Phase.BACKWARD)], op_type
    assert checked[("convolution", Phase.FORWARD)] == 3 and checked[("convolution_backward", Phase.BACKWARD)] == 3
    assert checked[("_scaled_dot_product_flash_attention_for_cpu_backward", Phase.BACKWARD)] == 1
    assert checked[("mm", Phase.BACKWARD)] > 0 and checked[("bmm", Phase.BACKWARD)] > 0


def test_gpt_step_matches_flop_counter_on_the_eager_step(gpt) -> None:
    """Per op packet, the captured graph's FLOPs equal FlopCounterMode's on the eager step."""
    demo = gpt_adamw_step(**SMALL_GPT)
    with FlopCounterMode(display=False) as mode:
        demo.step_fn(*demo.make_inputs(0))
    eager = {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}
    ours: collections.Counter[str] = collections.Counter()
    for c in costed(gpt[1]):
        if _counted_by_torch(c):
            ours[str(c.node.target.overloadpacket)] += c.cost.flops
    assert eager and dict(ours) == eager


def test_gpt_matmul_flops_match_the_analytic_count(gpt) -> None:
    demo, gm = gpt
    model = demo.model
    tokens = SMALL_GPT["batch_size"] * SMALL_GPT["seq_len"]
    assert model.n_ctx == SMALL_GPT["seq_len"]
    analytic = 6 * tokens * model.matmul_weight_count() + 12 * model.n_layer * model.n_ctx * model.d_model * tokens
    matmul = total_flops(c for c in costed(gm) if c.ann.type in MATMUL_TYPES)
    assert abs(matmul - analytic) <= 0.02 * analytic, (matmul, analytic)
