"""Eval-mode attention and encoder modules replay torch's fused path, bit for bit as eager.

``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and
``nn.TransformerEncoder`` run one fused kernel in eval mode without
autograd, and leave it whenever a capture runs: the replayed graph held the
ops one by one and differed from eager in the last bits (6e-8), silently.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 5


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    if i % 2:
        pad[1:, 4:] = True
    return torch.randn(3, 6, 8, generator=g), pad


def _attention() -> Callable[..., Any]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    return step


def _encoder() -> Callable[..., Any]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).eval()

    def step(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return encoder(x, src_key_padding_mask=pad)
    return step


@pytest.mark.parametrize("make", [_attention, _encoder], ids=["MultiheadAttention", "TransformerEncoder"])
def test_an_eval_module_on_torchs_fused_path_replays_it_bit_for_bit(make: Callable[[], Any]) -> None:
    eager, traced = make(), graphprof.trace(make())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, pad = _batch(i)
            expected, got = eager(x, pad), traced(x, pad)
            keep = ~pad[..., None].expand_as(expected)  # padded rows: no number eager promises
            assert torch.equal(expected[keep], got[keep]), f"call {i}"
        profile = traced.get_profile()
    assert traced.capture_mode == "whole-step"
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert any(node.op.startswith("graphprof.eager_forward") for _, node in profile.iter_nodes())


def test_a_training_module_is_captured_op_by_op() -> None:
    """No fused path in training mode: the attention's own ops are in the graph, as before."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    opt = torch.optim.SGD(mha.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = mha(x, x, x, need_weights=False)[0].pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    traced = graphprof.trace(step)
    for i in range(3):
        traced(_batch(i)[0])
    ops = {node.op for _, node in traced.get_profile().iter_nodes()}
    assert not any(op.startswith("graphprof.eager_forward") for op in ops) and any("addmm" in op or "linear" in op for op in ops), ops
