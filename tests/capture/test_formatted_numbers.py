"""``repr()`` of a number the step reads: refused, as ``str()`` and ``format()`` are, never baked.

``print(repr(loss.item()))``, ``f"{x!r}"`` and ``"%r" % x`` called
graphprof's own ``TracedScalar.__repr__`` during the capture: the graph
kept the text ``TracedScalar(0.36, node=...)`` and every replay printed it,
frozen at the capture call's value. Inside a capture, ``repr()`` now refuses
like ``str()`` and ``format()`` (segments, one warning, eager's text).

Why not keep the text of a setting the step reads as a guard: a number read
after the step changed it (a scheduler's ``get_last_lr()`` after
``sched.step()`` in the step) would be checked before the replay, on the
value the call starts with, and a replay would print the previous call's
text.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, Callable

import torch

import graphprof

CALLS = 6


class _Settings:
    note = 3


def _printed(traced: bool, body: Callable[[torch.Tensor], None]) -> tuple[list[str], Any, list[str]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        body(loss)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            lines.append(out.getvalue())
    return lines, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _compare(body: Callable[[torch.Tensor], None]) -> tuple[Any, list[str], list[str]]:
    eager, _, _ = _printed(False, body)
    lines, traced, messages = _printed(True, body)
    assert lines == eager
    return traced, messages, lines


def test_repr_of_a_number_read_from_a_tensor_refuses_with_one_warning() -> None:
    traced, messages, lines = _compare(lambda loss: print(f"{loss.item()!r}"))
    assert not any("TracedScalar" in line for line in lines) and len(set(lines)) == CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "repr() of a value read from a tensor" in messages[0], messages


def test_repr_of_a_setting_refuses_like_its_str() -> None:
    traced, messages, lines = _compare(lambda loss: print(repr(_Settings.note), "%r" % (_Settings.note,)))
    assert lines == ["3 3\n"] * CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "repr() of _Settings.note" in messages[0], messages
