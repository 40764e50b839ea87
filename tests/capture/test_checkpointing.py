"""Activation checkpointing with dropout, and RNG state calls inside a step.

The checkpoint saves the RNG state in the forward and sets it back for the
recomputation; the replay must do the same (capture/rng_calls.py) or the
recomputed dropout mask differs from the forward one. The recomputation is
its own scope in the profile (capture/checkpointing.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphprof.capture.checkpointing import RECOMPUTE_SCOPE
from tests.helpers import assert_bitwise_against_eager

CALLS = 6


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.tanh(self.fc(x)))


def _checkpointed(reentrant: bool, preserve: bool = True) -> Any:
    def make() -> tuple[nn.Module, Any]:
        model = nn.ModuleDict({"block": _Block(), "block2": _Block(), "head": nn.Linear(8, 1)})
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            h = checkpoint(model["block"], x, use_reentrant=reentrant, preserve_rng_state=preserve)
            h = checkpoint(model["block2"], h, use_reentrant=reentrant, preserve_rng_state=preserve)
            loss = model["head"](h).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return model, step

    return make


def _inputs(i: int) -> tuple[torch.Tensor]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
    return (x.requires_grad_(),)  # the reentrant flavour needs an input that requires grad


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpoint_with_dropout_replays_bitwise(reentrant: bool) -> None:
    traced = assert_bitwise_against_eager(_checkpointed(reentrant), _inputs, CALLS)
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_recomputation_is_its_own_scope_with_the_block_modules(reentrant: bool) -> None:
    traced = assert_bitwise_against_eager(_checkpointed(reentrant), _inputs, 5, profiling=True)
    nodes = [n for g in traced.get_profile().graphs for n in g.nodes]
    recomputed = [n for n in nodes if RECOMPUTE_SCOPE in n.scope]
    assert {n.type for n in recomputed} >= {"addmm", "tanh", "bernoulli_"}
    assert {n.module for n in recomputed if n.type == "addmm"} == {"block.fc", "block2.fc"}
    assert {n.phase for n in recomputed} == {"backward"}
    forward_addmm = [n for n in nodes if n.type == "addmm" and n.phase == "forward"]
    assert len(forward_addmm) == 3 and not any(RECOMPUTE_SCOPE in n.scope for n in forward_addmm)


def test_checkpoint_without_preserved_rng_state_replays_bitwise() -> None:
    assert_bitwise_against_eager(_checkpointed(False, preserve=False), _inputs, CALLS)


def test_rng_state_set_and_seeded_inside_the_step_is_replayed() -> None:
    def make() -> tuple[nn.Module, Any]:
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        counter = {"n": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            saved = torch.get_rng_state()
            first = model(x)
            torch.set_rng_state(saved)
            second = model(x)  # the same mask again
            counter["n"] += 1
            torch.manual_seed(counter["n"])
            loss = (first - second).pow(2).mean() + model(x).mean()
            loss.backward()
            opt.step()
            return loss

        return model, step

    traced = assert_bitwise_against_eager(make, _inputs, CALLS)
    assert traced.capture_mode == "whole-step"
