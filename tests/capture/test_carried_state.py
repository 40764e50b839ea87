"""Tensors a step carries to its next call in a tuple or list (an LSTM's ``(h, c)``) are read where
they are kept (capture/watched_state.py, ``_carried_tensors``).

The PyTorch word-language-model example keeps ``hidden`` between batches
and starts each with ``hidden = repackage_hidden(hidden)``. The tensors of
the tuple were constants of the graph: the capture refused them, and the
step ran as segments.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof


def _repackage(h: Any) -> Any:
    return h.detach() if isinstance(h, torch.Tensor) else tuple(_repackage(v) for v in h)


def _language_model(kept_as: str) -> tuple[Callable[..., torch.Tensor], nn.Module, Callable[[], Any],
                                           Callable[[Any], None]]:
    torch.manual_seed(0)
    rnn, head = nn.LSTM(4, 8), nn.Linear(8, 4)
    opt = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
    hidden: Any = (torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
    state = {"hidden": [torch.zeros(1, 3, 8), torch.zeros(1, 3, 8)]}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal hidden
        if kept_as == "tuple":
            hidden = _repackage(hidden)
            out, hidden = rnn(x, hidden)
        else:
            h, c = [t.detach() for t in state["hidden"]]
            out, (h, c) = rnn(x, (h, c))
            state["hidden"] = [h, c]
        loss = (head(out) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def carried() -> Any:
        return hidden if kept_as == "tuple" else state["hidden"]

    def put(value: Any) -> None:
        nonlocal hidden
        if kept_as == "tuple":
            hidden = tuple(value)
        else:
            state["hidden"] = list(value)

    return step, rnn, carried, put


@pytest.mark.parametrize("kept_as", ["tuple", "list"])
def test_an_lstm_state_carried_between_calls_replays_whole_step(kept_as: str) -> None:
    (eager, eager_rnn, eager_carried, eager_put), (step, rnn, carried, put) = (
        _language_model(kept_as), _language_model(kept_as))
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(8):
            if i == 5:  # a new sequence: the state is reset from outside, with a batch of another size
                for put_now in (eager_put, put):
                    put_now([torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)])
            g = torch.Generator().manual_seed(i)
            batch = 3 if i < 5 else 2
            x, y = torch.randn(5, batch, 4, generator=g), torch.randn(5, batch, 4, generator=g)
            assert torch.equal(eager(x, y), traced(x, y)), f"call {i}"
            assert all(torch.equal(a, b) for a, b in zip(eager_carried(), carried())), f"call {i}"
            assert all(torch.equal(a, b) for a, b in zip(eager_rnn.parameters(), rnn.parameters())), f"call {i}"
    assert traced.capture_mode == "whole-step"


def test_a_carried_list_that_grows_captures_again() -> None:
    """Its length is held: a replay of a graph made for two tensors would read two of three."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
        torch.manual_seed(0)
        layer = nn.Linear(4, 4)
        state: dict[str, Any] = {"mems": [torch.zeros(4), torch.ones(4)]}

        def step(x: torch.Tensor) -> torch.Tensor:
            total = sum(m.detach() for m in state["mems"])
            out = layer(x + total)
            state["mems"] = [out.detach()[0], *[m.detach() for m in state["mems"][1:]]]
            return out.sum().detach()

        return step, state

    (eager, eager_state), (step, state) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    for i in range(6):
        if i == 4:
            eager_state["mems"].append(torch.full((4,), 2.0))
            state["mems"].append(torch.full((4,), 2.0))
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager(x), traced(x)), f"call {i}"
        assert all(torch.equal(a, b) for a, b in zip(eager_state["mems"], state["mems"]))
    assert traced.capture_mode == "whole-step" and traced.captures == 2
