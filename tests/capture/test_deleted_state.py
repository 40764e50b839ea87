"""A capture that is not kept puts back what the step deleted, and all the rest, before the step runs again.

``prune.remove(m, "weight")`` at step k deletes the ``weight_mask`` buffer
and the ``weight_orig`` parameter; a step may also ``del S["x"]``,
``delattr`` a field, pop a buffer, delete a submodule, a global or a
closure's variable. The undo read each watched place to put it back, met
the deleted one (``KeyError``) and stopped there: the values after it kept
graphprof's traced numbers (``S["i"]``), and that call and every later one
raised where eager does not. Now every place is put back, a deleted one
made again where it was (capture/watched_state.py, capture/module_contents.py), so
that the step's run after the refusal, and every later call, gives eager's
results; and a place that cannot be put back is named by one error, raised
after everything else is back (capture/errors.py, ``StateNotRestored``).
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn

import graphprof
from graphprof.capture.errors import StateNotRestored
from graphprof.capture.held_values import Place
from graphprof.capture.watched_state import Watched, WatchedState
from graphprof.capture.locations import Location, item_location

CALLS = 6
#: The call at which the step deletes.
AT = 2


class _Box:
    """A plain object of the user's, with fields the step counts in and deletes."""


class _Twin:
    """A model, its optimizer and the step's state, with a step that deletes as ``kind`` says at call
    ``AT``; with ``refused``, the capture of that call is refused for another reason after the deletion."""

    def __init__(self, kind: str, refused: bool) -> None:
        torch.manual_seed(0)
        self.kind, self.refused = kind, refused
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.model.register_buffer("ema", torch.zeros(2))
        self.model.add_module("probe", nn.Identity())
        if kind == "prune":
            prune.l1_unstructured(self.model[0], "weight", amount=0.3)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.S: dict[str, Any] = {"i": 0, "x": 1.5, "hist": [[1], [2], [3]], "z": 3}
        self.box = _Box()
        self.box.seen, self.box.extra, self.box.tail = 0, 2.5, "t"

    def step(self, x: torch.Tensor, n: int) -> torch.Tensor:
        model, S, box, kind = self.model, self.S, self.box, self.kind
        out = model(x)
        loss = out.pow(2).mean() * S.get("x", 1.0)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if "ema" in model._buffers:
            model.ema.mul_(0.5).add_(out.detach().mean(0))
        box.seen += 1
        if S["i"] == AT:
            if kind == "prune":
                prune.remove(model[0], "weight")  # makes the pruning permanent: refused on its own
            elif kind == "dict key":
                del S["x"]
            elif kind == "dict pop":
                S.pop("z")
            elif kind == "delattr":
                delattr(box, "extra")
            elif kind == "buffer":
                model._buffers.pop("ema")
            elif kind == "submodule":
                del model.probe
            elif kind == "list shortened":
                S["hist"].pop()
                S["hist"][0].append(9)
            elif kind == "container replaced":
                S["hist"] = [[0]]
            if self.refused:  # a number read anew on every call, given to code that wants a plain one
                json.dumps(n)
        S["i"] += 1
        return loss.detach()

    def observed(self) -> dict[str, Any]:
        """What the user sees: the model's state and structure (keys in order), gradients, the
        optimizer's state, and the step's Python state."""
        model = self.model
        return {"state": [(k, v.clone()) for k, v in model.state_dict().items()],
                "parameters": [(n, p.detach().clone(), None if p.grad is None else p.grad.clone())
                               for n, p in model.named_parameters()],
                "modules": [(n, type(m).__name__, list(vars(m)), list(m._buffers), len(m._forward_pre_hooks))
                            for n, m in model.named_modules()],
                "optimizer": repr(self.opt.state_dict()), "S": repr(self.S), "box": repr(vars(self.box))}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _outcome(run: Callable[..., torch.Tensor], *args: Any) -> Any:
    try:
        return run(*args)
    except Exception as exc:  # the same error on both sides, or the difference is reported
        return f"raised {type(exc).__name__}: {exc}"


def _compare(make: Callable[[], Any], run: Callable[[Any, Any, int], torch.Tensor],
             observe: Callable[[Any], Any]) -> tuple[Any, list[str]]:
    """Eager and traced twins (``make()``), called ``CALLS`` times (``run(twin, step, i)``); everything
    ``observe`` gives is equal after every call. Returns the traced step and graphprof's warnings. The
    eager twin runs all its calls first: a global the step deletes is one for both twins, and ``make``
    sets it again."""
    eager = make()
    expected = [(_outcome(run, eager, eager.step, i), observe(eager)) for i in range(CALLS)]
    twin = make()
    traced = graphprof.trace(twin.step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (result, want) in enumerate(expected):
            got = _outcome(run, twin, traced, i)
            assert _equal(result, got), f"call {i}: {result} != {got}"
            seen = observe(twin)
            for key in want:
                assert _equal(want[key], seen[key]), f"call {i}: {key} differs"
    return traced, [str(w.message) for w in caught if "graphprof" in str(w.message)]


def _call(twin: _Twin, step: Any, i: int) -> torch.Tensor:
    return step(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)), i)


@pytest.mark.parametrize("kind", ["prune", "dict key", "dict pop", "delattr", "buffer", "submodule",
                                  "list shortened", "container replaced"])
def test_a_refused_capture_puts_back_what_the_step_deleted_and_later_calls_match_eager(kind: str) -> None:
    _, warned = _compare(lambda: _Twin(kind, refused=kind != "prune"), _call, _Twin.observed)
    assert len(warned) == 1, warned


def test_prune_remove_at_a_later_call_is_refused_once_and_the_rest_replay() -> None:
    traced, warned = _compare(lambda: _Twin("prune", refused=False), _call, _Twin.observed)
    assert len(warned) == 1 and "weight" in warned[0], warned
    assert traced.capture_mode == "whole-step"


@pytest.mark.parametrize(("kind", "named"), [("delattr", "self.box.extra"), ("buffer", "self.model.ema")])
def test_a_deletion_a_replay_would_not_repeat_is_refused_by_name(kind: str, named: str) -> None:
    _, warned = _compare(lambda: _Twin(kind, refused=False), _call, _Twin.observed)
    assert len(warned) == 1 and f"deletes {named}" in warned[0], warned


# -- a global and a closure's variable ------------------------------------------------------------------

_GLOBAL_SCALE = 1.5
_GLOBAL_CALLS = 0


class _Closure:
    """A step over a closure's variable and a global, one of which it deletes at call ``AT``, before
    a refusal."""

    def __init__(self, kind: str) -> None:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        S = {"i": 0}
        total = 0.0
        globals().update(_GLOBAL_SCALE=1.5, _GLOBAL_CALLS=0)

        def step(x: torch.Tensor, n: int) -> torch.Tensor:
            nonlocal total
            global _GLOBAL_SCALE, _GLOBAL_CALLS
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            _GLOBAL_CALLS += 1
            if S["i"] == AT:
                if kind == "global":
                    del _GLOBAL_SCALE
                else:
                    del total
                json.dumps(n)  # refused
            elif S["i"] < AT:
                total += 1.0
            S["i"] += 1
            return loss.detach()

        def observed() -> dict[str, Any]:
            try:
                kept = total
            except NameError:
                kept = "deleted"
            return {"S": dict(S), "total": kept, "global": globals().get("_GLOBAL_SCALE", "deleted"),
                    "calls": _GLOBAL_CALLS,
                    "model": [p.detach().clone() for p in model.parameters()]}

        self.step, self.observed = step, observed


@pytest.mark.parametrize("kind", ["global", "closure variable"])
def test_a_refused_capture_puts_back_a_deleted_global_or_closure_variable(kind: str) -> None:
    try:
        _, warned = _compare(lambda: _Closure(kind), lambda twin, step, i: step(
            torch.randn(3, 4, generator=torch.Generator().manual_seed(i)), i), lambda twin: twin.observed())
    finally:
        globals().update(_GLOBAL_SCALE=1.5, _GLOBAL_CALLS=0)
    assert len(warned) == 1, warned


# -- what cannot be put back ------------------------------------------------------------------------


class _Locked:
    """Fields no code may set or delete through the object (set in ``__init__`` around its guard)."""

    __slots__ = ("scale", "name")

    def __init__(self) -> None:
        object.__setattr__(self, "scale", 2.0)
        object.__setattr__(self, "name", "a")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{name} is read-only")


def test_a_place_that_cannot_be_put_back_is_named_after_everything_else_is_back() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = _Locked()
    S = {"i": 0, "seen": 0}

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).pow(2).mean() * cfg.scale
        opt.zero_grad()
        loss.backward()
        opt.step()
        S["seen"] += 1
        if S["i"] == 1:
            object.__delattr__(cfg, "name")  # past its guard: nothing can set it again
        S["i"] += 1
        return loss.detach()

    traced = graphprof.trace(step)
    traced(torch.randn(3, 4))
    with pytest.raises(StateNotRestored, match="cfg.name"):
        traced(torch.randn(3, 4))
    assert S == {"i": 1, "seen": 1} and type(S["i"]) is int and type(S["seen"]) is int


def test_the_undo_of_python_values_goes_on_past_one_that_fails_and_names_it() -> None:
    """An entry that cannot be put back does not keep the entries after it from being put back."""
    first, last = {"n": "traced"}, {"n": "traced"}

    def refuse(value: Any) -> None:
        raise TypeError("read-only")

    stuck = Location("stuck", lambda: "now", refuse, Place.ATTRIBUTE, object(), "stuck")
    state = WatchedState(watched=[Watched(item_location(first, "n", "first"), 1), Watched(stuck, "before"),
                                  Watched(item_location(last, "n", "last"), 2)])
    with pytest.raises(StateNotRestored, match="stuck") as caught:
        state.restore()
    assert first == {"n": 1} and last == {"n": 2}
    assert [where for where, _ in caught.value.failures] == ["stuck"]
