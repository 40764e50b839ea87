"""Tests for the built-in demo models and steps.

These workloads are the fixtures for the rest of graphprof, so the
properties checked here (shapes, seed determinism, input reproducibility,
steps that actually train) are the ones other tests silently rely on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from graphprof.demo import (
    DEMO_STEPS,
    GPT,
    DemoStep,
    ResNet,
    gpt_adamw_step,
    mlp_sgd_step,
    resnet_sgd_step,
)

# Small GPT overrides keep the GPT-based step tests fast.
_TINY_GPT = {"vocab_size": 32, "n_ctx": 16, "d_model": 16, "n_layer": 1, "n_head": 2}


def _small_kwargs(name: str) -> dict[str, object]:
    """Shrunken factory arguments so the parametrized tests stay fast."""
    if name.startswith("gpt"):
        return {"batch_size": 2, "seq_len": 8, **_TINY_GPT}
    if name == "resnet":
        return {"batch_size": 4, "image_size": 16}
    if name == "tiny-mlp":
        return {"depth": 8}
    return {}


def test_resnet_output_shape_and_structure() -> None:
    model = ResNet(num_classes=7, dropout=0.1)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)
    assert isinstance(model.layer1[0].shortcut, nn.Identity)
    assert isinstance(model.layer2[0].shortcut, nn.Sequential)
    assert isinstance(model.layer3[0].relu, nn.ReLU)
    assert isinstance(model.drop, nn.Dropout)


def test_gpt_output_shape_and_mask_not_persistent() -> None:
    model = GPT(**_TINY_GPT)
    idx = torch.randint(0, 32, (3, 10))
    assert model(idx).shape == (3, 10, 32)
    assert not any(k.endswith("mask") for k in model.state_dict())


def test_gpt_is_causal() -> None:
    """Changing a future token must not change logits at earlier positions."""
    model = GPT(**_TINY_GPT).eval()
    idx = torch.randint(0, 32, (1, 8))
    idx2 = idx.clone()
    idx2[0, -1] = (idx[0, -1] + 1) % 32
    assert torch.allclose(model(idx)[:, :-1], model(idx2)[:, :-1])


@pytest.mark.parametrize("tie", [False, True])
def test_gpt_matmul_weight_count(tie: bool) -> None:
    v, d, n_layer = 32, 16, 3
    model = GPT(vocab_size=v, n_ctx=8, d_model=d, n_layer=n_layer, n_head=2, tie_weights=tie)
    expected = n_layer * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + d * v
    assert model.matmul_weight_count() == expected


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        (resnet_sgd_step, {"batch_size": 2, "image_size": 16}),
        (gpt_adamw_step, {"batch_size": 2, "seq_len": 8, **_TINY_GPT}),
        (mlp_sgd_step, {}),
    ],
)
def test_same_seed_gives_identical_models(
    factory: Callable[..., DemoStep], kwargs: dict[str, object]
) -> None:
    a, b = factory(seed=3, **kwargs), factory(seed=3, **kwargs)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = factory(seed=4, **kwargs)
    assert not all(torch.equal(sa[k], v) for k, v in c.model.state_dict().items())


@pytest.mark.parametrize("name", sorted(DEMO_STEPS))
def test_step_trains_and_returns_finite_loss(name: str) -> None:
    step = DEMO_STEPS[name](**_small_kwargs(name))
    assert isinstance(step, DemoStep)
    assert step.optimizer is not None
    before = {k: p.detach().clone() for k, p in step.model.named_parameters()}
    for i in range(2):
        loss = step.step_fn(*step.make_inputs(i))
        assert loss.dim() == 0
        assert torch.isfinite(loss).item()
    after = dict(step.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name", sorted(DEMO_STEPS))
def test_make_inputs_deterministic_and_index_dependent(name: str) -> None:
    step = DEMO_STEPS[name](**_small_kwargs(name))
    state = torch.get_rng_state()
    first, again, other = step.make_inputs(0), step.make_inputs(0), step.make_inputs(1)
    assert torch.equal(state, torch.get_rng_state()), "make_inputs touched the global RNG"
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert any(not torch.equal(x, y) for x, y in zip(first, other))
