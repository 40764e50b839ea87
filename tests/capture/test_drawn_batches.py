"""A step that draws its own batch (``x, y = next(loader_iter)``), and tensors of unknown origin.

make_fx held the drawn batch as a constant, so every replay trained on the
capture call's batch again, silently. ``next()`` on an iterator the calling
code keeps now refuses the capture before drawing (the step run another way
draws that same batch, none is skipped), and any constant tensor that is
neither an argument, nor state the step reaches, nor made by the step
refuses it too.
"""

from __future__ import annotations

import logging
import types
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import graphprof

CALLS = 5


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g)


def _loop(draw: str) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x_all, y_all = _data()
    loader_iter = iter(DataLoader(TensorDataset(x_all, y_all), batch_size=8))
    batches = ((x_all[i:i + 8], y_all[i:i + 8]) for i in range(0, 40, 8))
    kept = {"it": iter([(x_all[i:i + 8], y_all[i:i + 8]) for i in range(0, 40, 8)])}

    def step() -> torch.Tensor:
        if draw == "a DataLoader iterator":
            x, y = next(loader_iter)
        elif draw == "a generator":
            x, y = next(batches)
        else:
            x, y = next(kept["it"])
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return model, step


def _calls(fn: Callable[[], torch.Tensor]) -> tuple[list[torch.Tensor], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [fn() for _ in range(CALLS)]
    return losses, [str(w.message) for w in caught]


@pytest.mark.parametrize("draw", ["a DataLoader iterator", "a generator", "a list's iterator kept in a dict"])
def test_a_batch_the_step_draws_is_never_replayed(draw: str) -> None:
    (eager_model, eager), (model, step) = _loop(draw), _loop(draw)
    traced = graphprof.trace(step)
    expected, _ = _calls(eager)
    losses, messages = _calls(traced)
    assert all(torch.equal(a, b) for a, b in zip(expected, losses)), "a batch was skipped or repeated"
    assert torch.equal(eager_model.weight, model.weight)
    assert len(messages) == 1 and "draws the next item of" in messages[0]
    assert traced.capture_mode == "segments"


def test_an_iterator_the_step_makes_itself_is_not_refused() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        first = next(model.parameters())  # torch's own generator, made in the step
        scale = next(iter([0.5, 2.0]))
        loss = F.mse_loss(model(x) * scale, y) + 0.0 * first.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    traced = graphprof.trace(step)
    x_all, y_all = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(CALLS):
            traced(x_all[8 * i:8 * i + 8], y_all[8 * i:8 * i + 8])
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def _deep_table_step(keep: Callable[[torch.Tensor], Any], read: Callable[[Any], torch.Tensor]
                     ) -> tuple[Callable[[torch.Tensor], torch.Tensor], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    helper = keep(torch.ones(4))

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = (model(x) * read(helper)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, helper


def _replace_table_at_call_3(make: Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], Any]],
                             put: Callable[[Any, torch.Tensor], None]) -> tuple[Any, list[str]]:
    (eager, eager_helper), (step, helper) = make(), make()
    traced = graphprof.trace(step)
    x_all, _ = _data()
    messages: list[str] = []
    for i in range(CALLS):
        if i == 3:
            put(eager_helper, torch.full((4,), 3.0))
            put(helper, torch.full((4,), 3.0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(eager(x_all[:8]), traced(x_all[:8])), f"call {i}"
        messages += [str(w.message) for w in caught]
    return traced, messages


def test_a_tensor_three_named_fields_down_is_read_where_it_is_kept() -> None:
    """``helper.inner.deeper.table``: the walk follows fields the step's code names, so a new table
    given between calls is read by the replay (it refused the capture when the walk stopped sooner)."""
    def put(helper: Any, table: torch.Tensor) -> None:
        helper.inner.deeper.table = table

    traced, messages = _replace_table_at_call_3(lambda: _deep_table_step(
        lambda t: types.SimpleNamespace(inner=types.SimpleNamespace(deeper=types.SimpleNamespace(table=t))),
        lambda h: h.inner.deeper.table), put)
    assert messages == []
    assert traced.capture_mode == "whole-step"


def test_a_tensor_in_a_namespace_kept_in_a_list_is_read_where_it_is_kept() -> None:
    """``helper.items[0].table``: a namespace in a list the step's state keeps is walked as a user's
    object is (capture/locations.py), so a new table given between calls is read by the replay."""
    def put(helper: Any, table: torch.Tensor) -> None:
        helper.items[0].table = table

    traced, messages = _replace_table_at_call_3(lambda: _deep_table_step(
        lambda t: types.SimpleNamespace(items=[types.SimpleNamespace(table=t)]),
        lambda h: h.items[0].table), put)
    assert messages == []
    assert traced.capture_mode == "whole-step"


def test_a_tensor_kept_in_a_library_object_refuses_the_capture() -> None:
    """``helper.items[0].table`` where ``items[0]`` is a library's object (its fields are the
    library's, not watched): its value would be baked into the graph and a new table given between
    calls never read, so the capture refuses."""
    def keep(t: torch.Tensor) -> Any:
        held = logging.Formatter()
        held.table = t  # type: ignore[attr-defined]
        return types.SimpleNamespace(items=[held])

    def put(helper: Any, table: torch.Tensor) -> None:
        helper.items[0].table = table

    traced, messages = _replace_table_at_call_3(lambda: _deep_table_step(keep, lambda h: h.items[0].table), put)
    assert len(messages) == 1 and "neither an argument nor state it reaches" in messages[0]
    assert traced.capture_mode == "segments"
