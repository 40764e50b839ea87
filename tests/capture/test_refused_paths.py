"""A refused path goes to segments alone: the step's other paths keep replaying their graphs.

``if n % 3 == 0: sys.stdout.write(f"loss {loss.item():.4f}\n")`` refuses on
its logging calls (the text is known only once the replay ran, and only a
``print`` of it is formatted by the replay: ``test_printed_texts.py``). That
refusal used to send every later call to segments; now only the calls that
take the logging path do, and the others replay the graph captured for them.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any, Callable

import torch

import graphprof

CALLS = 10


def _loop(body: Callable[[dict[str, Any], torch.Tensor], None], traced: bool) -> tuple[str, list[Any], Any, list[str]]:
    """Printed text, parameters after every call, the traced function and graphprof's warnings."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    state: dict[str, Any] = {"n": 0, "modes": []}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        state["n"] += 1
        body(state, loss)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    out, params, modes = io.StringIO(), [], []
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        for i in range(CALLS):
            fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            params.append([p.detach().clone() for p in model.parameters()])
            modes.append(getattr(fn, "capture_mode", None))
    fn.modes = modes if traced else None  # type: ignore[attr-defined]
    return out.getvalue(), params, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _compare(body: Callable[[dict[str, Any], torch.Tensor], None]) -> tuple[Any, list[str], str]:
    eager_text, eager_params, _, _ = _loop(body, traced=False)
    text, params, traced, messages = _loop(body, traced=True)
    assert text == eager_text
    for i, (a, b) in enumerate(zip(eager_params, params)):
        assert all(torch.equal(p, q) for p, q in zip(a, b)), f"parameters differ after call {i}"
    return traced, messages, text


def _every_third(state: dict[str, Any], loss: torch.Tensor) -> None:
    if state["n"] % 3 == 0:
        sys.stdout.write(f"call {state['n']} loss {loss.item():.4f}\n")


def test_only_the_calls_that_take_a_refused_path_run_as_segments() -> None:
    traced, messages, text = _compare(_every_third)
    assert len(text.splitlines()) == CALLS // 3
    # Call 1 eager, call 2 captured, call 3 refused; from then on each call as its path decides.
    assert traced.modes[2:] == ["whole-step" if (i + 1) % 3 else "segments" for i in range(2, CALLS)]
    assert traced.captures == 1  # the later logging calls were not captured again
    assert len(messages) == 1 and "that take this path as torch.compile segments" in messages[0], messages
    assert "formatting of a value read from a tensor" in messages[0]


def test_a_refusal_with_no_other_path_profiles_every_call_as_segments() -> None:
    def always(state: dict[str, Any], loss: torch.Tensor) -> None:
        sys.stdout.write(f"loss {loss.item():.4f}\n")

    traced, messages, _ = _compare(always)
    assert traced.modes[2:] == ["segments"] * (CALLS - 2)
    assert len(messages) == 1 and "profiling step as torch.compile segments instead" in messages[0], messages


def test_a_path_whose_printed_count_changes_goes_to_segments_alone() -> None:
    """``sys.stdout.write(f"call {n}")`` every third call: its graph holds the text of the call it was
    captured on, and the next logging call writes another. That path goes to segments; the others replay."""
    def count(state: dict[str, Any], loss: torch.Tensor) -> None:
        if state["n"] % 3 == 0:
            sys.stdout.write(f"call {state['n']}\n")

    traced, messages, text = _compare(count)
    assert text.splitlines() == [f"call {n}" for n in range(3, CALLS + 1, 3)]
    # Call 3 captured the logging path (its text a guard), call 6 changed the text.
    assert traced.modes[2:] == ["whole-step"] * 3 + ["segments" if (i + 1) % 3 == 0 else "whole-step"
                                                     for i in range(5, CALLS)]
    assert traced.captures == 2
    assert len(messages) == 1 and "that take this path as torch.compile segments" in messages[0], messages
    assert "prints or formats a number that changed between calls" in messages[0]


def test_a_number_used_on_the_way_to_the_refusal_does_not_name_the_path() -> None:
    """``"." * n`` guards ``n`` itself on the logging path: kept in the refused path, no later logging
    call would meet it, and each would be captured and refused again, with a warning each time."""
    def dotted(state: dict[str, Any], loss: torch.Tensor) -> None:
        if state["n"] % 3 == 0:
            sys.stdout.write("." * state["n"] + f" {loss.item():.4f}\n")

    traced, messages, _ = _compare(dotted)
    assert traced.modes[2:] == ["whole-step" if (i + 1) % 3 else "segments" for i in range(2, CALLS)]
    assert traced.captures == 1 and len(messages) == 1, messages
