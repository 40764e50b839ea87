"""Every built-in optimizer on an accelerator, as a real loop drives it, equal to eager after every call.

On a device the optimizers take other paths than the CPU tests see: foreach
kernels by default (the step counts of a whole group advance in one
``_foreach_add_``), and ``fused=True`` where asked (Adam, AdamW and SGD; Adagrad's fused kernel is
CPU-only). The loop here has two
parameter groups, a one-cycle schedule stepped inside the step, gradient
clipping and a head that skips every third call, so the parameters' step
counts part ways. The first run of these on an H200 found RAdam and ASGD
flipping their ``rho_t > 5`` and ``max(1, step - t0)`` branches one call
late (fixed in capture/value_guards.py).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import assert_bitwise_against_eager
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR

O = torch.optim
OPTIMIZERS: dict[str, Callable[[Any], O.Optimizer]] = {
    "sgd": lambda groups: O.SGD(groups, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd-fused": lambda groups: O.SGD(groups, lr=0.05, momentum=0.9, fused=True),
    "adam-amsgrad": lambda groups: O.Adam(groups, lr=0.01, amsgrad=True),
    "adam-fused": lambda groups: O.Adam(groups, lr=0.01, fused=True),
    "adamw": lambda groups: O.AdamW(groups, lr=0.01),
    "adamw-fused": lambda groups: O.AdamW(groups, lr=0.01, fused=True),
    "nadam": lambda groups: O.NAdam(groups, lr=0.01),
    "radam": lambda groups: O.RAdam(groups, lr=0.01),
    "adamax": lambda groups: O.Adamax(groups, lr=0.01),
    "adagrad": lambda groups: O.Adagrad(groups, lr=0.01, lr_decay=0.01),
    "adadelta": lambda groups: O.Adadelta(groups),
    "rmsprop": lambda groups: O.RMSprop(groups, lr=0.01, centered=True, momentum=0.5),
    "rprop": lambda groups: O.Rprop(groups),
    "asgd": lambda groups: O.ASGD(groups, lr=0.01, t0=3),
}


def _loop(name: str) -> Callable[[], tuple[nn.Module, Any]]:
    def make() -> tuple[nn.Module, Any]:
        # On the device before the optimizer: Adagrad makes its state when constructed.
        model = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 1), nn.Linear(8, 1)]).to(accelerator())
        heads = list(model[1].parameters()) + list(model[2].parameters())
        opt = OPTIMIZERS[name]([{"params": model[0].parameters()}, {"params": heads, "lr": 0.003}])
        if name in ("adadelta", "rprop"):  # no lr to cycle in a useful range: a step schedule
            sched: Any = O.lr_scheduler.StepLR(opt, 2, 0.5)
        else:
            sched = O.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 0.01], total_steps=40,
                                              cycle_momentum=not name.startswith(("adagrad", "asgd")))

        def step(x: torch.Tensor, y: torch.Tensor, second_head: bool) -> tuple[torch.Tensor, list[float]]:
            opt.zero_grad(set_to_none=True)
            hidden = torch.tanh(model[0](x))
            out = model[1](hidden) + (model[2](hidden) if second_head else 0)
            loss = F.mse_loss(out, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            return loss.detach(), sched.get_last_lr()
        return model, step
    return make


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g), i % 3 != 1


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_each_optimizer_in_a_real_loop_on_the_device_equals_eager(name: str) -> None:
    traced = assert_bitwise_against_eager(_loop(name), _batch, 12, device=accelerator(), profiling=True)
    assert traced.captures >= 1  # whatever the mode, a capture was tried; equality is the point
