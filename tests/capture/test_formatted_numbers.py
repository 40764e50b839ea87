"""Numbers the step formats: a setting's text is a guard, a number read from a tensor refuses.

A step that printed a setting it reads from its objects (``print(f"lr
{cfg.lr}")``), or called library code that builds a message from a number
it was given (transformers' ``generate`` formats ``max_length`` on every
call), refused whole-step capture outright: "formatting of cfg.lr cannot be
replayed". Such a number is known before the step runs, so its text is now
kept as a guard, the replay printing the text eager prints. A text that
changes between calls (nearly always a counter the step advances or a value
it logs) falls back to segments at once, with one warning naming where the
number was formatted; a number read from a tensor (``loss.item()``) still
refuses. A text that only ``print`` takes is neither: the replay formats it
(``test_printed_texts.py``), so the tests of guards and refusals write
their text with ``sys.stdout.write``.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any, Callable

import pytest
import torch

import graphprof

CALLS = 6


class _Settings:
    note = 3
    scale = 2.5


def _printed(traced: bool, body: Callable[[torch.Tensor, dict[str, Any]], None],
             before_call: Callable[[int], None], calls: int) -> tuple[str, Any, list[str]]:
    """What ``calls`` calls of a small SGD step ending in ``body(loss, state)`` print; the traced function
    (or None) and graphprof's warnings. The parameters after the calls are compared by the callers."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state: dict[str, Any] = {"n": 0, "model": model,
                             "sched": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        body(loss, state)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            before_call(i)
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            with contextlib.redirect_stdout(out):
                fn(x)
    state["weights"] = model.weight.detach().clone()
    return out.getvalue(), (fn if traced else None, state), [str(w.message) for w in caught
                                                             if "graphprof" in str(w.message)]


def _compare(body: Callable[[torch.Tensor, dict[str, Any]], None],
             before_call: Callable[[int], None] = lambda i: None, calls: int = CALLS) -> tuple[Any, list[str], str]:
    eager_text, (_, eager_state), _ = _printed(False, body, before_call, calls)
    text, (traced, state), messages = _printed(True, body, before_call, calls)
    assert text == eager_text
    assert torch.equal(state["weights"], eager_state["weights"])
    assert state["n"] == eager_state["n"]
    return traced, messages, text


@pytest.fixture(autouse=True)
def _settings() -> Any:
    _Settings.note, _Settings.scale = 3, 2.5
    yield
    _Settings.note, _Settings.scale = 3, 2.5


def test_a_setting_printed_with_a_format_spec_replays_one_graph() -> None:
    traced, messages, text = _compare(
        lambda loss, state: print(f"note {_Settings.note:04d} {_Settings.note * _Settings.scale:.2f}"))
    assert text.splitlines() == ["note 0003 7.50"] * CALLS
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_str_and_print_of_a_setting_replay_one_graph() -> None:
    traced, messages, text = _compare(lambda loss, state: print(str(_Settings.note) + "!", _Settings.scale))
    assert text.splitlines() == ["3! 2.5"] * CALLS
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_setting_changed_between_calls_prints_its_new_text() -> None:
    """Printed, the text is formatted by the replay (one graph); written some other way, it is a guard
    on its text, and the changed text falls back to segments."""
    def change(i: int) -> None:
        _Settings.note = 3 if i < 3 else 5

    traced, messages, text = _compare(lambda loss, state: print(f"note {_Settings.note}"), change)
    assert text.splitlines() == ["note 3"] * 3 + ["note 5"] * 3
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1

    traced, messages, text = _compare(lambda loss, state: sys.stdout.write(f"note {_Settings.note}\n"), change)
    assert text.splitlines() == ["note 3"] * 3 + ["note 5"] * 3
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "_Settings.note" in messages[0], messages


def test_a_written_counter_falls_back_to_segments_at_once_with_one_warning_that_names_it() -> None:
    def count(loss: torch.Tensor, state: dict[str, Any]) -> None:
        state["n"] += 1
        sys.stdout.write(f"call {state['n']}\n")

    traced, messages, text = _compare(count)
    assert text.splitlines() == [f"call {i + 1}" for i in range(CALLS)]
    assert traced.capture_mode == "segments" and traced.captures == 1
    assert len(messages) == 1, messages
    assert "prints or formats a number that changed" in messages[0]
    assert "test_formatted_numbers.py:" in messages[0] and "state['n']" in messages[0]


def test_a_number_read_from_a_tensor_and_written_refuses_with_one_warning() -> None:
    traced, messages, text = _compare(lambda loss, state: sys.stdout.write(f"loss {loss.item():.4f}\n"))
    assert len(text.splitlines()) == CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "formatting of a value read from a tensor" in messages[0], messages


def test_repr_of_a_setting_is_its_text_and_of_a_read_number_refuses() -> None:
    """``repr()`` (and ``%r``, ``!r``) gave graphprof's own ``TracedScalar(3, node=...)``, baked into the
    graph: every replay printed that text, frozen at the capture call's value."""
    traced, messages, text = _compare(lambda loss, state: print(repr(_Settings.note), "%r" % (_Settings.scale,)))
    assert text.splitlines() == ["3 2.5"] * CALLS
    assert messages == [] and traced.capture_mode == "whole-step"

    traced, messages, text = _compare(lambda loss, state: sys.stdout.write(f"{loss.item()!r}\n"))
    assert "TracedScalar" not in text and len(set(text.splitlines())) == CALLS
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "repr() of a value read from a tensor" in messages[0], messages


def test_a_rate_formatted_after_the_steps_own_scheduler_step() -> None:
    """Its text, as a guard, would be checked before the replay, on the rate the call started with:
    on the call after the rate changed, the replay printed the previous call's text. Printed, the
    replay formats the rate it reads after its scheduler step; written, the text refuses."""
    def printed(loss: torch.Tensor, state: dict[str, Any]) -> None:
        state["sched"].step()
        print(f"lr={state['sched'].get_last_lr()[0]:.3e}")

    traced, messages, text = _compare(printed)
    assert len(set(text.splitlines())) == 4  # 0.1, 0.05, 0.025, 0.0125: eager's text on every call
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1

    def written(loss: torch.Tensor, state: dict[str, Any]) -> None:
        state["sched"].step()
        sys.stdout.write(f"lr={state['sched'].get_last_lr()[0]:.3e}\n")

    traced, messages, text = _compare(written)
    assert len(set(text.splitlines())) == 4
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "depends on StepLR.last_lr[0], read after StepLR.step" in messages[0], messages
