"""A refusal names the user's line in the user's terms, never graphprof's own types."""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof


def test_a_run_time_number_given_to_a_plain_number_parameter_is_said_plainly() -> None:
    """``json.dumps(i)`` of a number argument: it takes a real int, and the step's number arguments are
    read anew on every call; the refusal says so at the line, and segments run the step."""
    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)

        def step(i: int, x: torch.Tensor) -> torch.Tensor:
            noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)) * len(json.dumps(i))  # the line named
            loss = model(x + noise).square().mean()
            loss.backward()
            return loss

        return model, step

    messages = _refusals(make, lambda i: (i, torch.full((2, 4), float(i))))
    assert len(messages) == 1, messages
    assert "TracedScalar" not in messages[0] and "takes only a plain number" in messages[0]
    assert f"test_errors.py:{_line_of('# the line named')}" in messages[0]


def _refusals(make: Callable[[], tuple[nn.Module, Any]], inputs: Callable[[int], tuple[Any, ...]]) -> list[str]:
    """Run two copies of ``make()``'s step, eagerly and traced, for three calls; their results and
    gradients are equal. Returns the refusals the traced one warned."""
    eager_model, eager = make()
    traced_model, step = make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            assert torch.equal(eager(*inputs(i)), traced(*inputs(i)))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(eager_model.parameters(), traced_model.parameters()))
    return [str(w.message) for w in caught if "cannot capture" in str(w.message)]


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


def test_a_module_compiled_with_torch_compile_is_named_as_such() -> None:
    """make_fx cannot trace into a ``torch.compile``'d module; the refusal says that in the user's terms
    and torch.compile's segments run the step, equal to eager."""
    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        compiled = torch.compile(model, backend="eager")

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = compiled(x).square().mean()  # the compiled call
            loss.backward()
            return loss

        return model, step

    messages = _refusals(make, lambda i: (torch.full((2, 4), float(i)),))
    assert len(messages) == 1, messages
    assert "compiled with torch.compile" in messages[0] and "symbolically trace" not in messages[0]
    assert f"test_errors.py:{_line_of('# the compiled call')}" in messages[0]


def test_a_deep_copy_of_tensors_in_the_step_is_named_with_its_line() -> None:
    """``copy.deepcopy(model.state_dict())`` in a step refused with "NotImplementedError: argument of
    type: <class 'torch.storage.UntypedStorage'>", which named nothing the user wrote."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved: dict[str, Any] = {}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        saved["best"] = copy.deepcopy(model.state_dict())
        return loss.detach()

    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            traced(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "deep-copies tensors at tests/capture/test_errors.py:" in messages[0], messages
    assert torch.equal(saved["best"]["weight"], model.weight)
