"""LastSignature: a call matches the last key only where its own key would be equal."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from typing import Any

import torch
import torch.nn.functional as F

import graphprof

from graphprof.capture.signature import LastSignature, signature


def _last(*args: object, **kwargs: object) -> LastSignature:
    key, _ = signature(args, kwargs)
    last = LastSignature.of(key, args, kwargs)
    assert last is not None
    return last


def test_same_metadata_matches_and_any_field_that_differs_does_not() -> None:
    x, y = torch.zeros(4, 16), torch.zeros(4, dtype=torch.long)
    last = _last(x, y)
    assert last.matches((torch.ones(4, 16), torch.ones(4, dtype=torch.long)), {})
    assert last.matches((torch.nn.Parameter(torch.ones(4, 16), requires_grad=False), y), {})  # no tensor type in the key
    different = [
        (torch.zeros(5, 16), y),
        (torch.zeros(16, 4), y),
        (torch.zeros(4, 16, dtype=torch.float64), y),
        (torch.zeros(4, 16, requires_grad=True), y),
        (torch.zeros(16, 4).t(), y),  # the same shape, other strides
        (torch.zeros(4, 16, device="meta"), y),
        (x,),
        (x, y, y),
        (x, 3),
    ]
    for args in different:
        assert not last.matches(args, {}), args
        assert signature(args, {})[0] != last.key
    assert not last.matches((x, y), {"scale": 2.0})
    with torch.no_grad():
        assert not last.matches((x, y), {})


def test_matching_is_exactly_key_equality_over_many_calls() -> None:
    shapes, dtypes, grads = [(2, 3), (3, 2), (2, 3, 1)], [torch.float32, torch.float16], [False, True]
    tensors = [torch.zeros(s, dtype=d, requires_grad=g) for s, d, g in itertools.product(shapes, dtypes, grads)]
    for a, b in itertools.product(tensors, repeat=2):
        last = _last(a, b)
        for c, d in itertools.product(tensors[::3], repeat=2):
            assert last.matches((c, d), {}) == (signature((c, d), {})[0] == last.key)


def test_calls_of_other_forms_keep_no_record() -> None:
    x = torch.zeros(2)

    class Sub(torch.Tensor):
        pass

    for args, kwargs in [((x, 1), {}), ((x,), {"y": x}), (([x, x],), {}), ((x.as_subclass(Sub),), {})]:
        key, _ = signature(args, kwargs)
        assert LastSignature.of(key, args, kwargs) is None
    last = _last(x)
    assert not last.matches((x.as_subclass(Sub),), {})  # the full key decides for a subclass


def test_calls_inside_and_outside_autocast_take_their_own_graphs_and_equal_eager() -> None:
    """The autocast regions around the call are part of the key; a replay inside one does not cast twice."""
    def make() -> Any:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x).float(), torch.zeros(3, 4))
            loss.backward()
            opt.step()
            return loss
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step)
    for i in range(8):
        region = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if i % 3 == 2 else contextlib.nullcontext
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        with region():
            expected = eager(x)
        with region(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = traced(x)
        assert torch.equal(expected, got), f"call {i}"
        assert torch.equal(eager_model.weight, model.weight), f"call {i}"
    assert traced.captures == 2 and traced.capture_mode == "whole-step"


def test_a_new_default_dtype_takes_another_graph() -> None:
    """A factory call without a dtype was traced with the default one: changing it needs another graph."""
    def make() -> Any:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = (model(x) + torch.full((3, 1), 0.1)).pow(2).mean()  # the constant's dtype is the default
            loss.backward()
            opt.step()
            return loss
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step)
    before = torch.get_default_dtype()
    try:
        for i in range(6):
            torch.set_default_dtype(torch.float64 if i >= 3 else torch.float32)
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
            expected = eager(x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = traced(x)
            assert torch.equal(expected, got), f"call {i}"
            assert torch.equal(eager_model.weight, model.weight), f"call {i}"
    finally:
        torch.set_default_dtype(before)
    assert traced.captures == 2


def test_a_non_contiguous_argument_takes_another_graph() -> None:
    """``reshape`` traced on a contiguous tensor is a view; on a transposed one eager copies."""
    def make() -> Any:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x.reshape(2, 16)).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step)
    for i in range(6):
        base = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        x = base.t() if i >= 3 else base.t().contiguous()  # (8, 4) either way
        expected = eager(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = traced(x)
        assert torch.equal(expected, got), f"call {i}"
        assert torch.equal(eager_model.weight, model.weight), f"call {i}"
    assert traced.captures == 2
