"""A step that leaves one of torch's global settings changed runs as segments, which change it as eager does.

``torch.set_default_dtype``, ``torch.set_grad_enabled(flag)`` as a function,
``torch.set_printoptions``, ``torch.use_deterministic_algorithms`` or
``torch.set_num_threads`` in a step ran in the capture call only: every
replay left the setting as the last capture left it, so the step's tensors
came out in another dtype, its prints with other options, and the setting
after the call was not eager's.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 5
_OPTIONS = torch._tensor_str.PRINT_OPTS

#: Each setting: the setter the step calls with its flag, and how to read the setting.
SETTINGS: dict[str, tuple[Callable[[bool], Any], Callable[[], Any]]] = {
    "default dtype": (lambda flag: torch.set_default_dtype(torch.float64 if flag else torch.float32),
                      torch.get_default_dtype),
    "print options": (lambda flag: torch.set_printoptions(precision=2 if flag else 4), lambda: _OPTIONS.precision),
    "grad mode": (lambda flag: torch.set_grad_enabled(flag), torch.is_grad_enabled),
    "deterministic algorithms": (lambda flag: torch.use_deterministic_algorithms(flag),
                                 torch.are_deterministic_algorithms_enabled),
    "thread count": (lambda flag: torch.set_num_threads(1 if flag else 2), torch.get_num_threads),
}


#: What the warning names: the setter the step calls, or the setting it leaves changed (grad mode's setter
#: is also a ``with``, which is captured, so only the mode left changed refuses).
NAMED = {"default dtype": "torch.set_default_dtype", "print options": "torch.set_printoptions",
         "grad mode": "grad mode", "deterministic algorithms": "torch.use_deterministic_algorithms",
         "thread count": "torch.set_num_threads"}


def _make(setter: Callable[[bool], Any]) -> tuple[Callable[[torch.Tensor, bool], Any], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, flag: bool) -> Any:
        setter(flag)
        opt.zero_grad()
        with torch.enable_grad():
            out = model(x.float())
            out.pow(2).mean().backward()
        opt.step()
        print(out.detach())
        return out.detach(), torch.zeros(2)
    return step, model


def _calls(step: Callable[[torch.Tensor, bool], Any], read: Callable[[], Any]) -> list[tuple[Any, ...]]:
    """What each call returns and prints, and the setting it leaves, from the same start every run."""
    seen = []
    for i in range(CALLS):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            result, made = step(torch.randn(2, 4, generator=torch.Generator().manual_seed(i)), i % 2 == 0)
        seen.append((result.tolist(), made.dtype, out.getvalue(), read()))
    return seen


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_step_that_leaves_a_setting_changed_refuses_and_leaves_what_eager_leaves(name: str) -> None:
    setter, read = SETTINGS[name]
    start = (torch.get_default_dtype(), _OPTIONS.precision, torch.is_grad_enabled(),
             torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())

    def put_back() -> None:
        torch.set_default_dtype(start[0])
        torch.set_printoptions(precision=start[1])
        torch.set_grad_enabled(start[2])
        torch.use_deterministic_algorithms(start[3])
        torch.set_num_threads(start[4])

    try:
        eager, _ = _make(setter)
        expected = _calls(eager, read)
        put_back()
        step, _ = _make(setter)
        traced = graphprof.trace(step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _calls(traced, read)
    finally:
        put_back()
    assert got == expected
    messages = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    assert len(messages) == 1 and NAMED[name] in messages[0], messages
    assert traced.capture_mode == "segments"


def test_grad_mode_set_in_a_with_is_captured() -> None:
    """``with torch.set_grad_enabled(train):`` leaves nothing to repeat: the graph holds what ran."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(False):
            return model(x) * 2

    traced = graphprof.trace(evaluate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(3):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(traced(x), evaluate(x))
    assert traced.capture_mode == "whole-step"


def test_a_dtype_set_and_put_back_in_the_step_refuses_and_makes_eagers_tensors() -> None:
    """A replay would not set the dtype again around the factory between: it made float32 where eager
    made float64."""
    def make() -> Callable[[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)

        def step(x: torch.Tensor) -> torch.Tensor:
            torch.set_default_dtype(torch.float64)
            made = torch.zeros(2)
            torch.set_default_dtype(torch.float32)
            with torch.no_grad():
                return made + model(x).sum()
        return step

    eager, traced = make(), graphprof.trace(make())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x = torch.randn(3, generator=torch.Generator().manual_seed(i))
            expected, got = eager(x), traced(x)
            assert got.dtype == expected.dtype == torch.float64 and torch.equal(got, expected), f"call {i}"
    messages = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    assert len(messages) == 1 and "set_default_dtype" in messages[0], messages


@pytest.mark.parametrize("refused_later", [False, True], ids=["left-changed", "refused-after-it"])
@pytest.mark.parametrize("name", ["grad mode", "fused attention path"])
def test_a_step_that_flips_a_setting_flips_it_once(name: str, refused_later: bool) -> None:
    """A step that flips a setting from what it finds (``set_grad_enabled(not is_grad_enabled())``): the
    refused capture's flip is taken back before the step runs another way, or it flipped twice. Refused
    for leaving it changed, or for a branch on the loss after it."""
    read, write = {"grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
                   "fused attention path": (torch.backends.mha.get_fastpath_enabled,
                                            torch.backends.mha.set_fastpath_enabled)}[name]
    start = read()

    def run(traced: bool) -> list[bool]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            write(not read())
            opt.zero_grad()
            with torch.enable_grad():
                loss = model(x).pow(2).mean()
                loss.backward()
            if refused_later and loss > 100:  # a branch on the model's output: no static graph
                return loss.detach()
            opt.step()
            return loss.detach()

        fn = graphprof.trace(step) if traced else step
        seen = []
        try:
            for i in range(CALLS):
                fn(torch.randn(2, 4, generator=torch.Generator().manual_seed(i)))
                seen.append(read())
        finally:
            write(start)
        return seen

    expected = run(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal's one warning is tested above
        assert run(True) == expected
