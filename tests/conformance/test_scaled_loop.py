"""Conformance: Hugging Face models trained with a gradient scaler, overflowing calls included, as eager.

BERT and GPT-2 from small configs (dropout on), bfloat16 autocast, AdamW,
``torch.amp.GradScaler`` with ``unscale_`` and ``clip_grad_norm_`` before its
step, and a growth interval of two, so the scale grows and backs off within
the run. Calls 4 and 5 overflow (the loss is multiplied by an infinite
argument): the graph's overflow check stops those replays before anything
the user holds is written, and they run eagerly (capture/grad_scaler.py).
After every call the loss, the parameters, the scale and the random state
equal eager's, the step replays one graph, and nothing is warned.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import graphprof

pytest.importorskip("transformers")

from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel  # noqa: E402

CALLS = 9
OVERFLOWING = (4, 5)
pytestmark = pytest.mark.slow


def _model(kind: str) -> torch.nn.Module:
    if kind == "bert":
        return BertForSequenceClassification(BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, num_labels=3))
    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))


def _loop(kind: str, traced: bool) -> tuple[list[tuple[Any, ...]], Any]:
    torch.manual_seed(0)
    model = _model(kind)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)

    def step(ids: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss * scale
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    fn: Callable[..., torch.Tensor] = graphprof.trace(step, profiling=True) if traced else step
    torch.manual_seed(123)
    seen = []
    for i in range(CALLS):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 100, (4, 16), generator=g)
        labels = torch.randint(0, 3, (4,), generator=g) if kind == "bert" else ids
        loss = fn(ids, labels, torch.tensor(float("inf") if i in OVERFLOWING else 1.0))
        seen.append((loss, [p.detach().clone() for p in model.parameters()], scaler.get_scale(),
                     torch.get_rng_state()))
    return seen, fn


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_a_scaled_step_with_overflowing_calls_replays_one_graph_and_equals_eager(kind: str) -> None:
    expected, _ = _loop(kind, traced=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got, fn = _loop(kind, traced=True)
    scales = [e[2] for e in expected]
    assert scales[OVERFLOWING[0]] < scales[OVERFLOWING[0] - 1] and max(scales) > scales[0]  # backs off and grows
    for i, (e, g) in enumerate(zip(expected, got)):
        assert torch.equal(e[0], g[0]) or (i in OVERFLOWING and e[0].isinf().all() and g[0].isinf().all()), i
        assert all(torch.equal(a, b) for a, b in zip(e[1], g[1])), f"call {i}: parameters differ"
        assert e[2] == g[2] and torch.equal(e[3], g[3]), f"call {i}"
    assert fn.capture_mode == "whole-step" and fn.captures == 1
    assert len(fn.get_profile().steps) > 0
