"""A step that appends ``loss.item()`` to a list and reads the list is replayed whole-step, equal to eager.

``len(losses)``, ``losses[-1]``, ``sum(losses[-k:])``, ``sum(losses) /
len(losses)`` and a branch on ``len(losses) % k`` are read by every replay
where eager reads them (capture/growing_lists.py); the step used to be
refused and run as segments on every call. Each case runs an eager twin and
a traced twin and compares, after every call, the parameters, the list (its
items and that it is the user's list), the printed text and the returned
values.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 7
Log = Callable[[dict, torch.Tensor], Any]


def _make(log: Log) -> tuple[Callable[[torch.Tensor, torch.Tensor], Any], nn.Module, dict]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, Any] = {"losses": []}

    def step(x: torch.Tensor, y: torch.Tensor) -> Any:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item(), log(state, loss)

    return step, model, state


def _print_every_two(s: dict, loss: torch.Tensor) -> None:
    s["losses"].append(loss.item())
    if len(s["losses"]) % 2 == 0:
        print("step %d loss %.5f mean %.5f" % (len(s["losses"]), s["losses"][-1], sum(s["losses"][-2:]) / 2))


def _running_mean(s: dict, loss: torch.Tensor) -> dict:
    s["losses"].append(loss.item())
    return {"avg": sum(s["losses"]) / len(s["losses"]), "n": len(s["losses"])}


def _window_once_full(s: dict, loss: torch.Tensor) -> Any:
    s["losses"].append(loss.item())
    if len(s["losses"]) >= 3:
        return sum(s["losses"][-3:]) / 3
    return None


def _found_items(s: dict, loss: torch.Tensor) -> float:
    s["losses"].append(loss.item())
    previous = s["losses"][-2] if len(s["losses"]) > 1 else 0.0  # the last call's value
    return previous - s["losses"][-1] + s["losses"][0]  # and the first call's


LOGS: dict[str, Log] = {"print every two": _print_every_two, "running mean": _running_mean,
                        "window once full": _window_once_full, "items found": _found_items}


def _calls(log: Log, capsys: pytest.CaptureFixture[str]) -> tuple[Any, list[str]]:
    (eager, eager_model, eager_state), (step, model, state) = _make(log), _make(log)
    kept = state["losses"]
    traced = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            a = eager(x, y)
            eager_out = capsys.readouterr().out
            b = traced(x, y)
            assert capsys.readouterr().out == eager_out, f"printed text differs at call {i}"
            assert a == b, f"returned values differ at call {i}"
            assert state["losses"] == eager_state["losses"] and state["losses"] is kept, f"the list differs at call {i}"
            for p, q in zip(eager_model.parameters(), model.parameters()):
                assert torch.equal(p, q), f"parameters differ at call {i}"
    return traced, [str(w.message) for w in caught]


@pytest.mark.parametrize("case", list(LOGS))
def test_a_list_the_step_appends_to_and_reads_is_replayed_whole_step(case: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    traced, messages = _calls(LOGS[case], capsys)
    assert messages == [] and traced.capture_mode == "whole-step", messages
    assert traced.captures <= 3  # one graph per path: the branch's two outcomes, a short list's lengths


def _window_of_ten(s: dict, loss: torch.Tensor) -> float:
    s["losses"].append(loss.item())
    return sum(s["losses"][-10:]) / len(s["losses"][-10:])  # the whole list while it is shorter than ten


def _second_item(s: dict, loss: torch.Tensor) -> float:
    s["losses"].append(loss.item())
    return s["losses"][1] if len(s["losses"]) > 1 else 0.0  # appended by the capture call: counted from the start


def _before_appending(s: dict, loss: torch.Tensor) -> float:
    previous = s["losses"][-1] if s["losses"] else 0.0  # read before the view answers: as a constant
    s["losses"].append(loss.item())
    return previous


def _iterated(s: dict, loss: torch.Tensor) -> float:
    s["losses"].append(loss.item())
    return max(s["losses"])  # iterates the list: not answered by its view


@pytest.mark.parametrize("log", [_window_of_ten, _iterated, _second_item, _before_appending],
                         ids=["a short window", "max of the list", "an item appended, by its index",
                              "read before appending"])
def test_reads_a_replay_cannot_repeat_still_equal_eager(log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    """A window longer than the list is guarded by the list's length (a capture per length, then segments,
    with one warning); ``max`` iterates the list, and an appended item read by its index from the start or a
    read before the call appends are not answered by the view: refused, with one warning."""
    traced, messages = _calls(log, capsys)
    assert len(messages) <= 1
    if log is not _window_of_ten:
        assert traced.capture_mode == "segments" and len(messages) == 1


def _make_closure(kind: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], Any], nn.Module, dict]:
    """The list in the step's closure (``losses``), also kept as ``S["losses"]``, read through both."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses: list[float] = []
    k = 2
    S: dict[str, Any] = {"losses": losses, "kept": []}

    def step(x: torch.Tensor, y: torch.Tensor) -> Any:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if kind == "print":
            if len(losses) % k == 0:
                print("step %d loss %.5f mean %.5f" % (len(losses), losses[-1], sum(losses[-k:]) / k))
            return loss.item()
        if kind == "two names":
            print(f"mean {sum(S['losses']) / len(losses):.6f} last {S['losses'][-1]:.6f}")
            return len(S["losses"])
        if kind == "local alias":
            recent = S["losses"]
            return sum(recent[-2:]) if len(recent) > 1 else recent[-1]
        S["kept"].append(losses)  # kept elsewhere: refused
        return len(losses)

    return step, model, S


@pytest.mark.parametrize("kind", ["print", "two names", "local alias", "kept elsewhere"])
def test_a_closure_list_read_by_each_of_its_names(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    (eager, eager_model, eager_state), (step, model, state) = _make_closure(kind), _make_closure(kind)
    kept = state["losses"]
    traced = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            a = eager(x, y)
            eager_out = capsys.readouterr().out
            assert traced(x, y) == a, f"returned values differ at call {i}"
            assert capsys.readouterr().out == eager_out, f"printed text differs at call {i}"
            assert state["losses"] == eager_state["losses"] and state["losses"] is kept and type(kept) is list
            assert [v is kept for v in state["kept"]] == [v is eager_state["losses"] for v in eager_state["kept"]]
            for p, q in zip(eager_model.parameters(), model.parameters()):
                assert torch.equal(p, q), f"parameters differ at call {i}"
    messages = [str(w.message) for w in caught]
    if kind == "kept elsewhere":
        assert traced.capture_mode == "segments" and len(messages) == 1
    else:
        assert traced.capture_mode == "whole-step" and messages == [] and traced.captures <= 2, messages


def test_a_list_of_numbers_the_step_only_reads_is_read_by_each_replay() -> None:
    """A list of weights the step reads and never appends to is read as before: its items are constants of the
    graph, and the list is held with its items, so that a change between calls captures again."""
    def make() -> tuple[Callable[[torch.Tensor, torch.Tensor], Any], nn.Module, list[float]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        weights = [0.25, 0.75]

        def step(x: torch.Tensor, y: torch.Tensor) -> Any:
            opt.zero_grad()
            out = model(x)
            loss = (weights[0] * F.mse_loss(out[:, 0], y[:, 0]) + weights[-1] * F.mse_loss(out[:, 1], y[:, 1])
                    + (out * torch.tensor(weights)).mean())
            loss.backward()
            opt.step()
            return loss.item(), len(weights)

        return step, model, weights

    (eager, eager_model, eager_weights), (step, model, weights) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            if i == 4:
                eager_weights[0] = weights[0] = 0.5
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
            assert eager(x, y) == traced(x, y), f"returned values differ at call {i}"
            for p, q in zip(eager_model.parameters(), model.parameters()):
                assert torch.equal(p, q), f"parameters differ at call {i}"
    assert not caught and traced.capture_mode == "whole-step"
