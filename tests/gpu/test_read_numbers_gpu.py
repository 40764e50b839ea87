"""Numbers read from device tensors, step counters and class state, on an accelerator.

The CPU tests (tests/capture/test_read_numbers.py, test_state_counters.py,
test_class_state.py) show these replays equal eager on the CPU. On a device
the paths differ: ``.item()`` synchronises and copies to the host, a tensor
made from a read number must land on the device the step names, and the
optimizers run their foreach kernels by default (the CPU tests choose them).
Each case runs an eager and a traced copy and compares after every call.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_bitwise_against_eager, assert_same_optimizer_loop, optimizer_loop, two_heads_adam
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)


def _refusals(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "cannot capture step" in str(w.message)]


def test_a_device_tensor_made_of_a_read_number_is_made_anew_on_every_replay() -> None:
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            scale = torch.tensor(loss.item() * 2, device=x.device)
            (loss * scale).backward()
            opt.step()
            return loss.detach(), scale
        return model, step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(make, _batch, 6, device=accelerator(), profiling=True)
    assert not _refusals(caught)
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_each_parameter_keeps_its_own_step_count_with_the_default_foreach_adam() -> None:
    """Adam on a device runs foreach by default; the second head skips calls, so its count falls behind."""
    traced = assert_bitwise_against_eager(two_heads_adam(None), lambda i: (*_batch(i), i in (0, 1) or i % 3 == 0), 10,
                                          device=accelerator(), profiling=True)
    assert traced.capture_mode == "whole-step"


COUNTING = {
    "radam": lambda params: torch.optim.RAdam(params, lr=0.01),
    "asgd": lambda params: torch.optim.ASGD(params, lr=0.01, t0=3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
    # capturable: the counts stay on the device and the branches become tensor ops
    "adam-capturable": lambda params: torch.optim.Adam(params, lr=0.01, capturable=True),
    "radam-capturable": lambda params: torch.optim.RAdam(params, lr=0.01, capturable=True),
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=0.01, fused=True),
}


@pytest.mark.parametrize("name", sorted(COUNTING))
def test_optimizers_counting_steps_on_the_device_equal_eager(name: str) -> None:
    """On a device RAdam and ASGD default to foreach: the counters advance in one ``_foreach_add_``,
    which the value guards' check did not advance (they flipped one call late, silently)."""
    make = COUNTING[name]
    eager, _ = optimizer_loop(make, traced=False, calls=10, device=accelerator())
    traced, run = optimizer_loop(make, traced=True, calls=10, device=accelerator(), profiling=True)
    assert_same_optimizer_loop(eager, traced)
    assert run.get_profile().steps


class Counters:
    calls = 0
    losses: list[float] = []


def _class_state_run(traced: bool) -> tuple[list[Any], list[torch.Tensor]]:
    Counters.calls, Counters.losses = 0, []
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(accelerator())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        Counters.calls += 1
        Counters.losses.append(loss.item())
        return loss.detach()

    run = graphprof.trace(step, profiling=True) if traced else step
    side = []
    for i in range(6):
        x, y = _batch(i)
        loss = run(x.to(accelerator()), y.to(accelerator()))
        side.append((loss.cpu(), Counters.calls, list(Counters.losses)))
    return side, [p.detach().cpu() for p in model.parameters()]


def test_a_counter_and_a_log_kept_on_a_class_change_on_every_replay_on_the_device() -> None:
    eager, params_a = _class_state_run(False)  # one after the other: the class is shared
    traced, params_b = _class_state_run(True)
    for i, (a, b) in enumerate(zip(eager, traced)):
        assert torch.equal(a[0], b[0]) and a[1:] == b[1:], f"call {i}: {a[1:]} vs {b[1:]}"
    assert all(torch.equal(p, q) for p, q in zip(params_a, params_b))
