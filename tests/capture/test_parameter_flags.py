"""A step that freezes and unfreezes parameters itself: a GAN training its generator every other call.

The flags a call leaves depend on its path (``n_critic = 2``: the
discriminator is frozen after the generator's update, unfrozen at the start
of the next call). Replays left them as the call found them, so the next
call took its path with the wrong flags, and they differed from eager's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import graphprof


def _gan(n_critic: int) -> tuple[Callable[..., torch.Tensor], nn.Module, nn.Module]:
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    critic = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.999))
    counter = {"it": 0}

    def step(real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        counter["it"] += 1
        for p in critic.parameters():
            p.requires_grad_(True)
        opt_c.zero_grad()
        loss_c = F.softplus(-critic(real)).mean() + F.softplus(critic(generator(z).detach())).mean()
        loss_c.backward()
        opt_c.step()
        if counter["it"] % n_critic == 0:
            for p in critic.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad()
            F.softplus(-critic(generator(z))).mean().backward()
            opt_g.step()
        return loss_c.detach()
    return step, generator, critic


def _state(generator: nn.Module, critic: nn.Module) -> list[Any]:
    return [*(p.detach().clone() for p in generator.parameters()), *(p.detach().clone() for p in critic.parameters()),
            [p.requires_grad for p in critic.parameters()]]


def test_flags_a_step_switches_are_switched_by_every_replay() -> None:
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(9)]
    runs = []
    for traced in (False, True):
        step, generator, critic = _gan(n_critic=2)
        fn = graphprof.trace(step) if traced else step
        runs.append([(fn(*batch), _state(generator, critic)) for batch in batches])
        if traced:
            # One graph per path, the generator's path twice: its first call creates Adam's state.
            assert fn.capture_mode == "whole-step" and fn.captures == 3
    for (loss_a, state_a), (loss_b, state_b) in zip(*runs):
        assert torch.equal(loss_a, loss_b)
        assert state_a[-1] == state_b[-1]
        assert all(torch.equal(a, b) for a, b in zip(state_a[:-1], state_b[:-1]))
