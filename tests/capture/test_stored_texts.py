"""A line built from the step's numbers before it is printed replays whole-step with eager's text.

The PyTorch examples build the line first: ``mesg = "{}\\tEpoch {}: loss
{:.6f}".format(time.ctime(), e, l); print(mesg)`` (fast_neural_style),
``print("L: " + str(round(l, 4)))``, ``print("\\t".join([...]))``. These
refused the capture (segments on every call); now the text reaches print
through a local name, ``+`` and a join, and the replay formats its own
numbers (capture/text_flow.py), and ``time.ctime()`` is this call's time
(capture/time_texts.py). A text kept anywhere the user can see it (a list
of the state, ``len``, a comparison, a dict key, a list ``join`` builds
from a name) still refuses, with one warning, and eager's output.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from typing import Any, Callable

import pytest
import torch

import graphprof

CALLS = 5
_REASON = "of a value read from a tensor with .item() at"


def _run(body: Callable[[torch.Tensor, dict[str, Any]], Any], traced: bool
         ) -> tuple[str, list[Any], dict[str, Any], Any, list[str]]:
    """Printed text, the weights after every call, the state, the traced function, graphprof's warnings."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state: dict[str, Any] = {"n": 0, "lines": [], "seen": {}}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        state["n"] += 1
        body(loss, state)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    out, weights = io.StringIO(), []
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        for i in range(CALLS):
            _CALL[0] = i
            fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            weights.append([p.detach().clone() for p in model.parameters()]
                           + [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()])
    return out.getvalue(), weights, state, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _compare(body: Callable[[torch.Tensor, dict[str, Any]], Any]) -> tuple[Any, list[str], str]:
    eager_text, eager_weights, eager_state, _, _ = _run(body, traced=False)
    text, weights, state, traced, messages = _run(body, traced=True)
    assert text == eager_text
    assert all(torch.equal(a, b) for e, g in zip(eager_weights, weights) for a, b in zip(e, g))
    assert state == eager_state
    return traced, messages, text


#: The call of the step now running: the fake clock's hour (``_run`` sets it before each call).
_CALL = [0]
_LOG = logging.getLogger("stored_texts_test")


def _fake_time() -> float:
    return 1.7e9 + 3600.0 * _CALL[0]


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.time`` an hour later on every call of the step, and ``time.ctime`` of it: each call's time
    text differs, and eager's and the replay's are the same texts only if each reads its own call's time."""
    monkeypatch.setattr(time, "time", _fake_time)
    real_ctime = time.ctime
    monkeypatch.setattr(time, "ctime", lambda seconds=None: real_ctime(time.time() if seconds is None else seconds))
    real_strftime = time.strftime
    monkeypatch.setattr(time, "strftime", lambda form, when=None: real_strftime(
        form, time.localtime(time.time()) if when is None else when))


def _fast_neural_style(loss: torch.Tensor, state: dict[str, Any]) -> None:
    mesg = "{}\tEpoch {}:\t[{}/{}]\ttotal: {:.6f}".format(time.ctime(), 1, state["n"] * 4, 20, loss.item())
    print(mesg)


def _time_printed(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("{} loss {:.4f}".format(time.ctime(), loss.item()))  # straight to print: each call's time too


def _concatenated(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("L: " + str(round(loss.item(), 4)) + " | " + f"{loss.item():.2e}")


def _joined(loss: torch.Tensor, state: dict[str, Any]) -> None:
    entries = "\t".join(["Epoch: [1][{:3d}/5]".format(state["n"]), "Loss {:.4e}".format(loss.item()),
                         f"Acc {100 * loss.item():6.2f}"])
    print(entries)


def _nested_and_logged(loss: torch.Tensor, state: dict[str, Any]) -> None:
    head = f"step {state['n']}"
    tail = "loss " + str(loss.item())
    line = f"{head} | {tail}"
    print(line)
    print(line, head, sep=" / ")
    _LOG.warning(line)


def _a_tensor_formatted(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = f"loss {loss:.5f} step {state['n']}"  # a 0-dim tensor formatted as its number
    print(line)


def _strftime(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("[" + time.strftime("%Y-%m-%d %H:%M") + "] loss {:.3f}".format(loss.item()))


@pytest.mark.parametrize("body", [_fast_neural_style, _time_printed, _concatenated, _joined, _nested_and_logged,
                                  _a_tensor_formatted, _strftime],
                         ids=["fast_neural_style", "time printed", "concatenated", "joined", "nested and logged",
                              "a tensor", "strftime"])
def test_a_line_built_before_it_is_printed_replays_one_graph_with_eagers_text(
        body: Callable[..., None], fake_clock: None, caplog: pytest.LogCaptureFixture) -> None:
    traced, messages, text = _compare(body)
    assert len(set(text.splitlines())) == len(text.splitlines()) >= CALLS  # each call's own numbers and time
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_logged_line_built_before_replays_with_eagers_records(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="stored_texts_test"):
        _run(_nested_and_logged, traced=False)
        eager = [r.getMessage() for r in caplog.records]
        caplog.clear()
        _, _, _, traced, messages = _run(_nested_and_logged, traced=True)
        assert [r.getMessage() for r in caplog.records] == eager and len(set(eager)) == CALLS
    assert messages == [] and traced.capture_mode == "whole-step"


def _kept_in_a_list(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = f"loss {loss.item():.4f}"
    print(line)
    state["lines"].append(line)  # a replay would keep the capture call's marker, not this call's text


def _measured(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = "loss " + str(loss.item())
    print(line)
    state["width"] = len(line)


def _compared(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = "loss {:.1f}".format(loss.item())
    if line != "loss 0.0":
        print(line)


def _a_key(loss: torch.Tensor, state: dict[str, Any]) -> None:
    line = f"{loss.item():.2f}"
    print(line)
    state["seen"][line] = state["n"]


def _joined_by_name(loss: torch.Tensor, state: dict[str, Any]) -> None:
    entries = ["Epoch: [1]"]  # imagenet's ProgressMeter: a list built by name, then joined
    entries += ["Loss {:.4e}".format(loss.item())]
    print("\t".join(entries))


def _padded(loss: torch.Tensor, state: dict[str, Any]) -> None:
    print("{:>30}|".format("loss " + str(loss.item())))  # a width would pad the capture call's marker


@pytest.mark.parametrize("body", [_kept_in_a_list, _measured, _compared, _a_key, _joined_by_name, _padded],
                         ids=["kept in a list", "measured", "compared", "a dict key", "joined by name", "padded"])
def test_a_line_used_other_than_printed_refuses_with_eagers_text(body: Callable[..., None]) -> None:
    traced, messages, text = _compare(body)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and _REASON in messages[0] and "test_stored_texts.py" in messages[0], messages


def test_the_time_as_text_kept_in_the_state_refuses_naming_the_line(fake_clock: None) -> None:
    def body(loss: torch.Tensor, state: dict[str, Any]) -> None:
        state["started"] = time.ctime()

    traced, messages, _ = _compare(body)
    assert traced.capture_mode == "segments"
    assert len(messages) == 1 and "reads the time as text (time.ctime) at" in messages[0], messages
    assert "test_stored_texts.py" in messages[0]
