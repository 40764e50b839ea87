"""Host reads that copy a tensor's values out of make_fx's sight refuse, and the step matches eager.

``np.asarray(t)``, a numpy schedule indexed by sampled timesteps
(``schedule[t]``), ``np.from_dlpack(t)`` and ``torch.tensor([t[0], t[1]])``
read the values in C++ with graphprof's modes off: one capture, no warning,
and every replay used the capture call's values. Each case is compared with
eager after every call (result, parameters, RNG state), with one warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import assert_bitwise_against_eager

CALLS = 6
#: A diffusion noise schedule kept as a numpy array, as DDPM code keeps it.
SCHEDULE = np.cumprod(1.0 - np.linspace(1e-4, 0.2, 50))


def _accuracy(t: torch.Tensor) -> torch.Tensor:
    """Accuracy logged through numpy: its value becomes a tensor the step returns."""
    labels = torch.arange(3) * 16
    return torch.full((3,), float((np.asarray(t // 16) == np.asarray(labels // 16)).mean()))


#: name -> (how the step turns its sampled timesteps ``t`` into per-row factors, the reason's words)
REFUSED: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "schedule[t]": (lambda t: torch.from_numpy(SCHEDULE[t]).float(), "numpy conversion"),
    "schedule[t[0]]": (lambda t: torch.full((3,), float(SCHEDULE[t[0]])), "numpy conversion"),
    "np.asarray": (lambda t: torch.from_numpy(SCHEDULE[np.asarray(t)]).float(), "numpy conversion"),
    "np.array": (lambda t: torch.from_numpy(np.array(t) / 50.0).float(), "numpy conversion"),
    "np.float64": (lambda t: torch.full((3,), float(np.float64(t[0])) / 50), "numpy conversion"),
    "accuracy": (_accuracy, "numpy conversion"),
    "np.from_dlpack": (lambda t: torch.from_numpy(SCHEDULE[np.from_dlpack(t)]).float(), "DLPack export"),
    "torch.tensor(list)": (lambda t: torch.tensor([t[0], t[1], t[2]]).float() / 50, "torch.tensor() of a list"),
    "torch.as_tensor(list)": (lambda t: torch.as_tensor([t[0], t[1], t[2]]).float() / 50, "torch.as_tensor()"),
    "torch.asarray(list)": (lambda t: torch.asarray([t[0], t[1], t[2]]).float() / 50, "torch.asarray()"),
}
#: Conversions make_fx records as ops: still one graph.
CAPTURED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.from_numpy(schedule)[t]": lambda t: torch.from_numpy(SCHEDULE)[t].float(),
    "torch.tensor(t)": lambda t: torch.tensor(t).float() / 50,
    "torch.as_tensor(t)": lambda t: torch.as_tensor(t, dtype=torch.float32) / 50,
    "torch.asarray(t)": lambda t: torch.asarray(t, dtype=torch.float32) / 50,
}


def _noising_step(factors: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], tuple[nn.Module, Any]]:
    """A denoising step: timesteps sampled in the step pick each row's factor."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            t = torch.randint(0, 50, (3,))
            a = factors(t)
            noise = torch.randn_like(x)
            loss = (model(a.sqrt()[:, None] * x + (1 - a).abs().sqrt()[:, None] * noise) - noise).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach(), a
        return model, step
    return make


def _inputs(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(i)),)


def _graphprof_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("graphprof")]


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_conversion_that_copies_a_tensors_values_refuses_and_matches_eager(name: str) -> None:
    factors, reason = REFUSED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_noising_step(factors), _inputs, CALLS)
    messages = _graphprof_warnings(caught)
    assert len(messages) == 1 and reason in messages[0], messages
    assert traced.capture_mode != "whole-step"


@pytest.mark.parametrize("name", list(CAPTURED))
def test_a_conversion_make_fx_records_is_still_captured_whole_step(name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_noising_step(CAPTURED[name]), _inputs, CALLS)
    assert _graphprof_warnings(caught) == []
    assert traced.capture_mode == "whole-step"
