"""A ``torch.Generator`` seeded, restored or made inside the step (capture/rng_calls.py).

Eager code seeds ``g.manual_seed(...)`` or puts back ``g.set_state(st)`` on
every call, so the noise it draws follows the seeding; a replay must seed and
restore the same generator at the same place, or it keeps drawing from one
stream (different noise, parameters and generator state from the first
replay on). Each test runs an eager and a traced twin for eight calls and
compares results, parameters, gradients and the generator's state bitwise.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal

CALLS = 8
#: (model, step, the generator the step keeps or None) for one twin.
Twin = tuple[nn.Module, Callable[[torch.Tensor], Any], torch.Generator | None]


def _draws(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Every kind of draw a step makes with a generator: noise, a mask, a shuffle, indices, samples."""
    noise = torch.randn(x.shape, generator=g) + torch.rand(x.shape, generator=g)
    keep = torch.bernoulli(torch.full(x.shape, 0.7), generator=g)
    rows = torch.randperm(x.shape[0], generator=g)
    cols = torch.randint(0, x.shape[1], (x.shape[1],), generator=g)
    picked = torch.multinomial(torch.ones(x.shape[1]), 2, generator=g)
    jitter = torch.empty(x.shape).normal_(0.0, 0.1, generator=g)
    mixed = (x + noise + jitter) * keep
    return mixed[rows][:, cols] + mixed[:, picked].sum()


def _trained(draw_with: Callable[[torch.Tensor, dict], torch.Tensor]) -> Callable[[], Twin]:
    """A linear model trained on inputs drawn by ``draw_with(x, state)``, with a kept generator."""
    def make() -> Twin:
        model = nn.Linear(6, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state: dict[str, Any] = {"g": torch.Generator().manual_seed(5), "i": 0}

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(draw_with(x, state)).pow(2).mean()
            loss.backward()
            opt.step()
            state["i"] += 1
            return loss

        return model, step, state["g"]

    return make


def _assert_twins_match(make: Callable[[], Twin], whole_step: bool = True) -> list[str]:
    """Run both twins ``CALLS`` times; returns graphprof's warnings."""
    torch.manual_seed(0)
    model_a, step_a, g_a = make()
    torch.manual_seed(0)
    model_b, step_b, g_b = make()
    traced = graphprof.trace(step_b, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 + i))
            out_a, out_b = step_a(x), traced(x)
            where = f"after call {i}"
            assert torch.equal(out_a, out_b), f"result differs {where}"
            assert_modules_equal(model_a, model_b, where)
            if g_a is not None and g_b is not None:
                assert torch.equal(g_a.get_state(), g_b.get_state()), f"generator state differs {where}"
    said = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    if whole_step:
        assert traced.capture_mode == "whole-step" and not said, said
    return said


def test_generator_made_and_seeded_in_the_step_draws_the_same_noise_every_call() -> None:
    _assert_twins_match(_trained(lambda x, s: _draws(x, torch.Generator().manual_seed(7))))


def test_kept_generator_seeded_with_a_constant_in_the_step() -> None:
    _assert_twins_match(_trained(lambda x, s: _draws(x, s["g"].manual_seed(7))))


def test_kept_generator_seeded_from_a_counter_in_the_step() -> None:
    _assert_twins_match(_trained(lambda x, s: _draws(x, s["g"].manual_seed(1000 + s["i"]))))


def test_generator_made_in_the_step_seeded_from_a_counter() -> None:
    _assert_twins_match(_trained(lambda x, s: _draws(x, torch.Generator().manual_seed(1000 + s["i"]))))


def test_generator_state_read_and_put_back_in_the_step() -> None:
    def draw_twice(x: torch.Tensor, s: dict) -> torch.Tensor:
        saved = s["g"].get_state()
        first = _draws(x, s["g"])
        s["g"].set_state(saved)
        return first - _draws(x, s["g"]) + _draws(x, s["g"])  # the same draws again, then new ones

    _assert_twins_match(_trained(draw_twice))


def test_generator_set_to_a_state_saved_before_the_step() -> None:
    saved = torch.Generator().manual_seed(11).get_state()
    _assert_twins_match(_trained(lambda x, s: _draws(x, s["g"].set_state(saved) or s["g"])))


def test_kept_generator_drawn_without_seeding_continues_its_stream() -> None:
    _assert_twins_match(_trained(lambda x, s: _draws(x, s["g"])))


def test_fresh_random_seed_in_the_step_refuses_with_one_warning() -> None:
    def reseeded(x: torch.Tensor, s: dict) -> torch.Tensor:
        s["g"].seed()
        s["g"].manual_seed(3)
        return _draws(x, s["g"])

    said = _assert_twins_match(_trained(reseeded), whole_step=False)
    assert len(said) == 1 and "seed()" in said[0], said


def test_generator_made_in_the_step_without_a_seed_refuses_with_one_warning() -> None:
    said = _assert_twins_match(_trained(lambda x, s: _draws(x, torch.Generator())), whole_step=False)
    assert len(said) == 1 and "never seeded" in said[0], said


@pytest.mark.parametrize("copied", [copy.deepcopy, lambda g: g.clone_state()], ids=["deepcopy", "clone_state"])
def test_copy_of_a_generator_drawn_in_the_step_refuses_with_one_warning(copied: Any) -> None:
    said = _assert_twins_match(_trained(lambda x, s: _draws(x, copied(s["g"]))), whole_step=False)
    assert len(said) == 1 and "torch.Generator" in said[0], said
