"""Globals the step's code assigns: found by the walk through classes and modules, or refused
(capture/reachable.py, capture/name_reads.py: ``refuse_unseen_global_writes``).

A static method counting calls in its module's global (``Stats.bump()``),
reached through a class the step names, was not walked: the capture call
counted and no replay did, silently. A function reached by ``getattr`` on a
module (``getattr(schedules, name)(it)``) cannot be walked before the call;
the global it assigns is seen while the capture call runs, the capture is
refused with one warning, and the global is put back before the fallback
runs the call again.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 5

_HELPERS = """
calls = 0


class Stats:
    hits = 0

    @staticmethod
    def bump():
        global calls
        calls += 1

    @classmethod
    def hit(cls):
        cls.hits += 1


def decayed_lr(it):
    global calls
    calls += 1
    return 0.1 / (1 + it)
"""


def _helpers(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module of the user's code, imported from its file (one per copy: each counts its own calls)."""
    path = tmp_path / f"{name}.py"
    path.write_text(_HELPERS)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def _run(step_of: Callable[[types.ModuleType, nn.Module, torch.optim.Optimizer, dict[str, int]], Callable[..., Any]],
         helpers: types.ModuleType, traced: bool) -> tuple[list[tuple[Any, ...]], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = {"it": 0}
    step = step_of(helpers, model, opt, kept)
    fn = graphprof.trace(step, profiling=False) if traced else step
    seen = []
    for i in range(CALLS):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        loss = fn(x)
        seen.append((loss.item(), helpers.calls, helpers.Stats.hits, opt.param_groups[0]["lr"],
                     [p.detach().clone() for p in model.parameters()]))
    return seen, fn


def _assert_same(expected: list[tuple[Any, ...]], got: list[tuple[Any, ...]]) -> None:
    for i, (e, g) in enumerate(zip(expected, got)):
        assert e[:4] == g[:4], f"call {i}"
        assert all(torch.equal(a, b) for a, b in zip(e[4], g[4])), f"call {i}"


def _through_the_class(helpers: types.ModuleType, model: nn.Module, opt: torch.optim.Optimizer,
                       kept: dict[str, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        helpers.Stats.bump()
        helpers.Stats.hit()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return step


def test_static_and_class_methods_of_a_class_in_a_module_count_on_every_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected, _ = _run(_through_the_class, _helpers(tmp_path, "global_writes_eager", monkeypatch), traced=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, fn = _run(_through_the_class, _helpers(tmp_path, "global_writes_traced", monkeypatch), traced=True)
    _assert_same(expected, got)
    assert fn.capture_mode == "whole-step" and fn.captures == 1


_SAME_MODULE_CALLS = 0


class _Counter:
    @staticmethod
    def bump() -> None:
        global _SAME_MODULE_CALLS
        _SAME_MODULE_CALLS += 1


def _counting_step(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        _Counter.bump()
        return model(x).sum()
    return step


def test_a_static_method_of_a_class_the_step_names_counts_in_its_global_on_every_replay() -> None:
    global _SAME_MODULE_CALLS
    counts = []
    for traced in (False, True):
        _SAME_MODULE_CALLS = 0
        torch.manual_seed(0)
        fn = graphprof.trace(_counting_step(nn.Linear(4, 1)), profiling=False) if traced else _counting_step(
            nn.Linear(4, 1))
        seen = []
        for _ in range(CALLS):
            fn(torch.randn(2, 4))
            seen.append(_SAME_MODULE_CALLS)
        counts.append(seen)
    assert counts[0] == counts[1] == list(range(1, CALLS + 1))


def _by_name(helpers: types.ModuleType, model: nn.Module, opt: torch.optim.Optimizer,
             kept: dict[str, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    schedule = "decayed_lr"  # a config's choice

    def step(x: torch.Tensor) -> torch.Tensor:
        for group in opt.param_groups:
            group["lr"] = getattr(helpers, schedule)(kept["it"])
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        kept["it"] += 1
        return loss
    return step


def test_a_global_assigned_by_a_function_found_by_getattr_refuses_and_is_counted_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected, _ = _run(_by_name, _helpers(tmp_path, "global_writes_eager_by_name", monkeypatch), traced=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, fn = _run(_by_name, _helpers(tmp_path, "global_writes_traced_by_name", monkeypatch), traced=True)
    _assert_same(expected, got)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "assigns the global 'calls' of global_writes_traced_by_name" in messages[0]
    assert fn.capture_mode == "segments"


def _helper_counting_on_itself() -> int:
    _helper_counting_on_itself.calls += 1  # type: ignore[attr-defined]
    return _helper_counting_on_itself.calls  # type: ignore[attr-defined]


def test_a_counter_kept_on_a_helper_function_counts_on_every_replay() -> None:
    """``helper.calls += 1`` in a helper the step calls, its count setting the rate: replays never
    advanced it (a decorator's wrapper's counter was watched; a helper's was not)."""
    results = []
    for traced in (False, True):
        _helper_counting_on_itself.calls = 0  # type: ignore[attr-defined]
        torch.manual_seed(0)
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            for group in opt.param_groups:
                group["lr"] = 0.1 / (1 + _helper_counting_on_itself())
            opt.step()
            return loss.detach()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(CALLS + 1):
                loss = fn(torch.randn(4, 4, generator=torch.Generator().manual_seed(i)))
                seen.append((loss.item(), _helper_counting_on_itself.calls,  # type: ignore[attr-defined]
                             opt.param_groups[0]["lr"], [p.detach().clone() for p in model.parameters()]))
        if traced:
            assert fn.capture_mode == "whole-step" and fn.captures == 1
        results.append(seen)
    for i, (e, g) in enumerate(zip(*results)):
        assert e[:3] == g[:3] and all(torch.equal(a, b) for a, b in zip(e[3], g[3])), f"call {i}"
