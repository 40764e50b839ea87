"""State the step reaches through chains of named fields, a config module, a dict of partials
(capture/reachable.py: ``named_deeper``, ``module_fields``).

The walk of the step's state stopped two levels below a name: a flag at
``self.cfg.train.use_l2`` flipped between calls, a weight at
``cfg.loss.w`` changed, a counter at ``self.stats.epoch.count`` counted in
the step, a config module's ``SCALE`` changed, or the keywords of a
``functools.partial`` kept in a dict changed: every replay kept the capture
call's branch, value or count, silently.
"""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.util
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)


def _same_calls(make: Callable[[], tuple[Callable[..., Any], Any]],
                change: Callable[[int, Any], None], observe: Callable[[Any], Any]) -> Any:
    """Run a fresh eager copy and a fresh traced copy call by call, ``change`` applied to both kept
    states before each call; assert equal losses, weights and observed state after every call."""
    eager_step, eager_kept = make()
    traced_step, traced_kept = make()
    traced = graphprof.trace(traced_step, profiling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whole-step: no fallback warning either
        for i in range(CALLS):
            change(i, eager_kept)
            change(i, traced_kept)
            x, y = _batch(i)
            a, b = eager_step(x, y), traced(x, y)
            assert torch.equal(a.detach(), b), f"call {i}: loss {a.item()!r} != {b.item()!r}"
            assert torch.equal(eager_kept.model.weight, traced_kept.model.weight), f"call {i}: weights differ"
            assert observe(eager_kept) == observe(traced_kept), f"call {i}"
    assert traced.capture_mode == "whole-step"
    return traced


def _trainer(cfg: Any) -> tuple[Callable[..., Any], Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    kept = NS(model=model, opt=torch.optim.SGD(model.parameters(), lr=0.1), cfg=cfg)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        kept.opt.zero_grad()
        loss = F.cross_entropy(kept.model(x), y) * kept.cfg.loss.scale.w
        if kept.cfg.train.use_l2:
            loss = loss + 0.1 * kept.model.weight.pow(2).sum()
        loss.backward()
        kept.opt.step()
        kept.cfg.stats.epoch.count += 1
        kept.cfg.stats.epoch.seen.append(kept.cfg.stats.epoch.count)
        return loss

    return step, kept


def test_a_flag_a_weight_and_a_counter_three_levels_down_are_the_steps_state() -> None:
    def make() -> tuple[Callable[..., Any], Any]:
        return _trainer(NS(train=NS(use_l2=False), loss=NS(scale=NS(w=1.0)), stats=NS(epoch=NS(count=0, seen=[]))))

    def change(i: int, kept: Any) -> None:
        if i == 3:
            kept.cfg.train.use_l2 = True
        if i == 4:
            kept.cfg.loss.scale.w = 0.5

    traced = _same_calls(make, change, lambda kept: (kept.cfg.stats.epoch.count, kept.cfg.stats.epoch.seen))
    # One capture more for the flag, as for a field one level down. The weight multiplies the loss and is
    # read at run time, in the forward and where the backward uses it (capture/saved_numbers.py).
    assert traced.captures == 2


@pytest.mark.parametrize("made", ["imported from a file", "types.ModuleType"])
def test_a_config_module_the_step_names_is_read_as_globals_are(made: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config: Any
    if made == "imported from a file":
        (tmp_path / "deep_state_config.py").write_text("SCALE = 1.0\nFLAG = False\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        config = importlib.import_module("deep_state_config")
        monkeypatch.setitem(sys.modules, "deep_state_config", config)
    else:  # a namespace without a file
        config = types.ModuleType("deep_state_namespace")
        config.SCALE, config.FLAG = 1.0, False

    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x) * config.SCALE, y)
            if config.FLAG:
                loss = loss * 2
            loss.backward()
            opt.step()
            return loss

        return step, NS(model=model)

    def change(i: int, kept: Any) -> None:
        if i == 3:
            config.SCALE, config.FLAG = 3.0, True

    _same_calls(make, change, lambda kept: None)  # both copies read the one module, changed once


def test_a_config_module_the_step_imports_in_its_body_is_read_as_globals_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``import cfg`` (or ``from cfg import SCALE``) inside the step: the module is no global of the
    step's, and a replay kept the capture call's numbers and branch after ``cfg`` changed."""
    (tmp_path / "deep_state_local_config.py").write_text("SCALE = 1.0\nFLAG = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = importlib.import_module("deep_state_local_config")
    monkeypatch.setitem(sys.modules, "deep_state_local_config", config)

    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            import deep_state_local_config as cfg
            from deep_state_local_config import FLAG
            opt.zero_grad()
            loss = F.cross_entropy(model(x) * cfg.SCALE, y)
            if FLAG:
                loss = loss * 2
            loss.backward()
            opt.step()
            return loss

        return step, NS(model=model)

    def change(i: int, kept: Any) -> None:
        if i == 3:
            config.SCALE, config.FLAG = 3.0, True

    _same_calls(make, change, lambda kept: None)


def test_a_config_module_the_step_imports_relatively_in_its_body_is_read_as_globals_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``from . import cfg`` in a step of a package: the import's name alone ("") found no module."""
    package = tmp_path / "deep_state_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cfg.py").write_text("SCALE = 1.0\n")
    (package / "steps.py").write_text(
        "import torch.nn.functional as F\n"
        "def make_step(model, opt):\n"
        "    def step(x, y):\n"
        "        from . import cfg\n"
        "        opt.zero_grad()\n"
        "        loss = F.cross_entropy(model(x) * cfg.SCALE, y)\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        return loss\n"
        "    return step\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = importlib.import_module("deep_state_package.steps")
    config = importlib.import_module("deep_state_package.cfg")
    for name in ("deep_state_package", "deep_state_package.steps", "deep_state_package.cfg"):
        monkeypatch.setitem(sys.modules, name, sys.modules[name])

    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        return steps.make_step(model, torch.optim.SGD(model.parameters(), lr=0.1)), NS(model=model)

    def change(i: int, kept: Any) -> None:
        if i == 3:
            config.SCALE = 3.0

    _same_calls(make, change, lambda kept: None)


def test_the_keywords_of_a_partial_kept_in_a_dict_are_watched() -> None:
    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = {"ce": functools.partial(F.cross_entropy, label_smoothing=0.0)}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = losses["ce"](model(x), y)
            loss.backward()
            opt.step()
            return loss

        return step, NS(model=model, losses=losses)

    def change(i: int, kept: Any) -> None:
        if i == 3:
            kept.losses["ce"].keywords["label_smoothing"] = 0.3

    _same_calls(make, change, lambda kept: None)


@pytest.mark.parametrize("kind", ["dict", "defaultdict"])
def test_a_callback_kept_in_a_dict_of_lists_logs_on_every_replay(kind: str) -> None:
    """minGPT's ``trigger_callbacks``: the callback's closure list was reached by no name, so replays
    appended nothing, and the capture call left graphprof's own number in it."""
    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log: list[float] = []

        def on_batch_end(trainer: Any) -> None:
            log.append(trainer.loss.item())

        callbacks: dict[str, list[Any]] = {} if kind == "dict" else collections.defaultdict(list)
        callbacks["on_batch_end"] = [on_batch_end]  # minGPT's set_callback
        trainer = NS(model=model, callbacks=callbacks, loss=None)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            trainer.loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            trainer.loss.backward()
            opt.step()
            for callback in trainer.callbacks.get("on_batch_end", []):
                callback(trainer)
            return trainer.loss.detach()

        return step, trainer

    _same_calls(make, lambda i, kept: None,
                lambda kept: [(type(v), v) for v in kept.callbacks["on_batch_end"][0].__closure__[0].cell_contents])


class _Lit(nn.Module):
    """Lightning-style ``self.log``: values kept in a dict of lists under a private name of the module."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Linear(4, 3)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self._logged: dict[str, list[Any]] = {}

    def log(self, name: str, value: torch.Tensor) -> None:
        self._logged.setdefault(name, []).append(value.detach().clone())
        self._logged.setdefault(f"{name}_item", []).append(value.item())

    def training_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.log("loss", loss)
        return loss.detach()


def test_a_dict_of_lists_a_module_keeps_under_a_private_name_is_the_steps_state() -> None:
    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        module = _Lit()
        return module.training_step, module

    def observe(module: _Lit) -> list[Any]:
        return [(k, [v.tolist() if isinstance(v, torch.Tensor) else (type(v), v) for v in values])
                for k, values in module._logged.items()]

    _same_calls(make, lambda i, kept: None, observe)


@pytest.mark.parametrize("read_back", [False, True])
def test_a_list_reached_by_two_names_is_extended_once_per_replay(read_back: bool) -> None:
    """``hist`` in the step's closure and ``trainer.hist`` are one list: two effects appended each value
    twice per replay. Read through the other name after the append (a moving average), both names hold one
    view of it while the capture runs (capture/growing_lists.py): replayed, reading the list each call."""
    def make() -> tuple[Callable[..., Any], Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hist: list[float] = []
        trainer = NS(model=model, hist=hist, calls=0)

        def step(x: torch.Tensor, y: torch.Tensor) -> Any:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            hist.append(loss.item())
            trainer.calls += 1
            if read_back:
                return sum(trainer.hist) / len(trainer.hist)
            return loss.detach()

        return step, trainer

    if not read_back:
        _same_calls(make, lambda i, kept: None, lambda kept: (kept.calls, kept.hist))
        return
    (eager, eager_kept), (step, kept) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            assert eager(*_batch(i)) == traced(*_batch(i)), f"call {i}"
    assert kept.hist == eager_kept.hist
    assert traced.capture_mode == "whole-step" and not caught


_HELPER_MODULE = """
from math import cos, pi

calls = 0
history = []


def get_lr(it):
    global calls
    calls += 1
    return 1e-4 + 0.5 * (1.0 + cos(pi * it / 20)) * (1e-3 - 1e-4)


def log(value):
    history.append(value)
"""


def test_the_functions_of_a_module_the_step_names_keep_their_globals(tmp_path: Path) -> None:
    """``import sched_utils`` and ``sched_utils.get_lr(it)`` in the step: the function, reached through
    its module's attribute, counted its calls and logged in its module's globals in the capture call
    only (one count, one entry, where eager had one per call). Its ``from math import cos`` is computed
    by every replay too (capture/math_calls.py), where it captured again on every call."""
    path = tmp_path / "deep_state_helpers.py"
    path.write_text(_HELPER_MODULE)

    def make() -> tuple[Callable[..., Any], Any]:
        spec = importlib.util.spec_from_file_location("deep_state_helpers", path)
        assert spec is not None and spec.loader is not None
        helpers = importlib.util.module_from_spec(spec)  # one module per copy: each counts its own calls
        spec.loader.exec_module(helpers)
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = NS(model=model, helpers=helpers, opt=opt, it=0)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for group in opt.param_groups:
                group["lr"] = helpers.get_lr(kept.it)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            helpers.log(loss.item())
            kept.it += 1
            return loss

        return step, kept

    traced = _same_calls(make, lambda i, kept: None,
                         lambda kept: (kept.helpers.calls, list(kept.helpers.history), kept.opt.param_groups[0]["lr"]))
    assert traced.captures <= 3
