"""Two more places the step keeps Python state: a decorator's wrapper, and a list it rebuilds.

* ``@count_calls`` sets ``wrapper.calls += 1`` on the wrapper function it
  returns. Only the innermost function (``__wrapped__``) was looked at, so the
  count stayed at the capture call's value in every replay, silently. Every
  function of the ``__wrapped__`` chain is now read for names like the step,
  and its public data attributes are watched.
* ``history = history + [loss.item()]`` assigned the capture call's list, its
  old items as constants, on every replay. A list or dict the step rebuilds
  from what it read of the old one now refuses the capture, with one warning.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6
history: list[float] = []


def count_calls(f: Callable[..., Any]) -> Any:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wrapper.calls += 1  # type: ignore[attr-defined]
        return f(*args, **kwargs)
    wrapper.calls = 0  # type: ignore[attr-defined]
    return wrapper


def _run(traced: bool, decorated: bool) -> tuple[list[Any], Any, list[str]]:
    global history
    history = []
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        global history
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if not decorated:
            history = history + [loss.item()]
        return loss.detach()

    fn = count_calls(step) if decorated else step
    run = graphprof.trace(fn, profiling=True) if traced else fn
    observed = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            g = torch.Generator().manual_seed(i)
            loss = run(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g))
            observed.append((loss.item(), getattr(fn, "calls", None), list(history),
                             [p.detach().clone() for p in model.parameters()]))
    return observed, run, [str(w.message) for w in caught if "cannot capture" in str(w.message)]


def _same(a: list[Any], b: list[Any]) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert x[:3] == y[:3], f"call {i}: {x[:3]} vs {y[:3]}"
        assert all(torch.equal(p, q) for p, q in zip(x[3], y[3])), f"call {i}"


def test_a_decorator_counting_calls_on_its_wrapper_counts_every_replay() -> None:
    eager, _, _ = _run(False, decorated=True)
    traced, run, refusals = _run(True, decorated=True)
    _same(eager, traced)
    assert traced[-1][1] == CALLS and not refusals
    assert run.capture_mode == "whole-step" and run.captures == 1


def test_a_list_rebuilt_from_its_old_items_refuses_the_capture_and_grows_as_in_eager() -> None:
    eager, _, _ = _run(False, decorated=False)
    traced, run, refusals = _run(True, decorated=False)
    _same(eager, traced)
    assert len(traced[-1][2]) == CALLS
    assert len(refusals) == 1 and "builds history anew" in refusals[0], refusals
    assert run.capture_mode != "whole-step"


def test_a_library_s_wrapper_is_not_read_as_the_step_s_code() -> None:
    """``@torch.no_grad()`` wraps the step in torch's own function: its module's names are torch's, not
    the step's state, and are not watched."""
    from graphprof.capture.reachable import reachable_locations

    model = nn.Linear(4, 1)

    @torch.no_grad()
    def predict(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    assert {loc.describe for loc, _, _ in reachable_locations(predict)} == {
        "model", "model.in_features", "model.out_features"}
    run = graphprof.trace(predict)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = [run(torch.full((2, 4), float(i))) for i in range(4)]
    assert all(torch.equal(out, model(torch.full((2, 4), float(i))).detach()) for i, out in enumerate(outs))
    assert run.capture_mode == "whole-step" and run.captures == 1
