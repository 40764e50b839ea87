"""Hyperparameters the step writes into ``param_groups`` itself: replayed, or refused, never frozen.

Each scenario runs the same loop eagerly and traced and compares after
every call: the loss, the parameters and every group's hyperparameters.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


class _Loop:
    def __init__(self, write: Callable[["_Loop"], None], sched: bool = False) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5) if sched else None
        self.it = 0
        self.write = write

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.it += 1
        self.write(self)
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        return loss.detach()


def _groups(opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _assert_same_optimizer(a: torch.optim.Optimizer, b: torch.optim.Optimizer, where: str) -> None:
    """Groups (values and their types) and per-parameter state are equal; so are a wrapped optimizer's."""
    assert _groups(a) == _groups(b), f"param_groups differ {where}"
    assert all(type(v) is type(w) for e, c in zip(_groups(a), _groups(b)) for v, w in zip(e.values(), c.values()))
    state_a, state_b = a.state_dict()["state"], b.state_dict()["state"]
    assert state_a.keys() == state_b.keys(), f"optimizer state differs {where}"
    for key, fields in state_a.items():
        for name, value in fields.items():
            other = state_b[key][name]
            same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
            assert same, f"optimizer state {key}.{name} differs {where}"
    if hasattr(a, "optimizer"):
        _assert_same_optimizer(a.optimizer, b.optimizer, where)


def _twins(make: Callable[[], tuple[Callable[..., Any], nn.Module, torch.optim.Optimizer]],
           calls: int = 7) -> tuple[Any, list[str]]:
    """Two setups from ``make()`` (the step, its model, its optimizer), one run eagerly and one traced,
    compared after every call: the loss, the parameters and gradients, the groups and the state."""
    torch.manual_seed(0)
    eager, eager_model, eager_opt = make()
    torch.manual_seed(0)
    step, model, opt = make()
    traced = graphprof.trace(step)
    messages: list[str] = []
    for i in range(calls):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        expected = eager(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        assert torch.equal(expected, got), f"loss differs on call {i}"
        assert_modules_equal(eager_model, model, f"after call {i}")
        _assert_same_optimizer(eager_opt, opt, f"after call {i}")
    return traced, messages


def _run(write: Callable[[_Loop], None], sched: bool = False, calls: int = 7) -> tuple[Any, list[str]]:
    def make() -> tuple[Callable[..., Any], nn.Module, torch.optim.Optimizer]:
        loop = _Loop(write, sched)
        return loop.step, loop.model, loop.opt
    return _twins(make, calls)


def _warmup(loop: _Loop) -> None:
    for group in loop.opt.param_groups:
        group["lr"] = 0.01 * loop.it  # computed from a counter the step keeps: an input


def _decay(loop: _Loop) -> None:
    loop.opt.param_groups[0]["lr"] *= 0.9  # computed from the group's own number


def test_a_learning_rate_computed_from_the_steps_counter_is_written_on_every_replay() -> None:
    traced, messages = _run(_warmup)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_learning_rate_decayed_in_place_is_written_on_every_replay() -> None:
    """``g["lr"] *= 0.9`` reads the group's own number: an input read when the step starts."""
    traced, messages = _run(_decay)
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_learning_rate_the_step_reads_is_the_group_s_at_each_call() -> None:
    """Logged and returned from the group, with a scheduler stepped outside the step: the capture
    call's rate was logged and returned on every replay."""
    def make() -> tuple[Callable[..., Any], torch.optim.lr_scheduler.LRScheduler, list[float]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        logged: list[float] = []

        def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            logged.append(opt.param_groups[0]["momentum"] * opt.param_groups[0]["lr"])
            return loss.detach(), opt.param_groups[0]["lr"]
        return step, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), logged

    (eager, eager_sched, eager_log), (step, sched, log) = make(), make()
    traced = graphprof.trace(step)
    for i in range(7):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        (a, lr_a), (b, lr_b) = eager(x, y), traced(x, y)
        assert torch.equal(a, b) and lr_a == lr_b and type(lr_b) is float, f"call {i}: {lr_a} against {lr_b}"
        eager_sched.step()
        sched.step()
    assert log == eager_log and len(set(log)) > 2
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_scheduler_stepped_in_the_step_writes_its_own_learning_rate() -> None:
    traced, messages = _run(lambda loop: None, sched=True)
    assert traced.capture_mode == "whole-step" and not messages


def test_a_write_before_a_scheduler_steps_is_still_the_steps_own() -> None:
    traced, messages = _run(_decay, sched=True)
    assert traced.capture_mode == "segments" and len(messages) == 1


def _high_every_third(loop: _Loop) -> None:
    for group in loop.opt.param_groups:
        group["lr"] = 0.2 if loop.it % 3 == 1 else 0.05  # a constant on each path


def _betas_ping_pong(loop: _Loop) -> None:
    loop.opt.param_groups[0]["betas"] = (0.5, 0.999) if loop.it % 2 else (0.9, 0.999)


def test_a_constant_rate_written_on_every_call_is_this_call_s_on_every_replay() -> None:
    """The constant was made an input read from the group: once both paths were captured, a replay
    of one updated with, and left in the group, the rate the other path had written."""
    traced, messages = _run(_high_every_third, calls=8)
    assert traced.capture_mode == "whole-step" and traced.captures == 2 and not messages


def test_a_tuple_of_constants_written_in_turn_is_this_call_s_on_every_replay() -> None:
    traced, messages = _run(_betas_ping_pong, calls=8)
    assert traced.capture_mode == "whole-step" and traced.captures == 2 and not messages


def test_a_constant_written_before_a_scheduler_steps_is_refused() -> None:
    """The scheduler's replayed call reads the group before the graph's end writes the constant."""
    traced, messages = _run(_high_every_third, sched=True, calls=8)
    assert traced.capture_mode == "segments" and len(messages) == 1 and "param_groups[0]['lr']" in messages[0]


class _AlphadlLookahead(torch.optim.Optimizer):
    """alphadl/lookahead.pytorch's Lookahead: a counter in each group, reset to the constant 0 every
    ``k`` steps, and the slow weights synced when it is 0. It shares the wrapped optimizer's groups
    and does not call ``Optimizer.__init__`` (the hooks' dicts are what torch's ``step`` wrapper needs)."""

    def __init__(self, optimizer: torch.optim.Optimizer, k: int = 3, alpha: float = 0.5) -> None:
        self.optimizer, self.k, self.alpha = optimizer, k, alpha
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state: Any = defaultdict(dict)
        self._optimizer_step_pre_hooks: Any = OrderedDict()
        self._optimizer_step_post_hooks: Any = OrderedDict()
        self._optimizer_state_dict_pre_hooks: Any = OrderedDict()
        self._optimizer_state_dict_post_hooks: Any = OrderedDict()
        for group in self.param_groups:
            group["counter"] = 0

    def _update(self, group: dict[str, Any]) -> None:
        for fast in group["params"]:
            state = self.state[fast]
            if "slow_param" not in state:
                state["slow_param"] = torch.zeros_like(fast.data)
                state["slow_param"].copy_(fast.data)
            slow = state["slow_param"]
            slow += (fast.data - slow) * self.alpha
            fast.data.copy_(slow)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = self.optimizer.step(closure)
        for group in self.param_groups:
            if group["counter"] == 0:
                self._update(group)
            group["counter"] += 1
            if group["counter"] >= self.k:
                group["counter"] = 0
        return loss


class _PhasedSGD(torch.optim.SGD):
    """Writes a constant rate into its groups in its own ``step``, from a phase it keeps there too."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for group in self.param_groups:
            group["lr"] = 0.2 if group["phase"] % 3 == 0 else 0.05
            group["phase"] += 1
        return super().step(closure)


def _optimizer_loop(make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> Callable[[], Any]:
    def make() -> tuple[Callable[..., Any], nn.Module, torch.optim.Optimizer]:
        model = nn.Linear(4, 1)
        opt = make_optimizer(model.parameters())

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, model, opt
    return make


def test_a_group_counter_the_optimizer_resets_to_a_constant_resets_on_every_replay() -> None:
    """Lookahead's reset was made an input read from the group: the counter stuck where the other
    path left it, and the slow weights were never synced again."""
    traced, messages = _twins(_optimizer_loop(lambda params: _AlphadlLookahead(torch.optim.Adam(params, lr=0.01))),
                              calls=9)
    # One graph per value of the counter; the call that makes the slow weights runs eagerly.
    assert traced.capture_mode == "whole-step" and traced.captures == 3 and not messages


def test_a_constant_rate_an_optimizer_writes_in_its_own_step_is_left_in_its_groups() -> None:
    """The update used the rate written (the optimizer read its own write), but the group was left
    holding the other path's rate, which the user sees and logs."""
    def phased(params: Any) -> torch.optim.Optimizer:
        opt = _PhasedSGD(params, lr=0.1)
        opt.param_groups[0]["phase"] = 0
        return opt
    traced, messages = _twins(_optimizer_loop(phased), calls=8)
    assert traced.capture_mode == "whole-step" and traced.captures == 2 and not messages


class _Holder:
    """A trainer's plain object keeping its optimizers in a container (``self.optimizers = [opt]``)."""


@pytest.mark.parametrize("kept", ["list", "dict"])
def test_an_optimizer_a_plain_object_keeps_in_a_container_replays_and_keeps_its_numbers(kept: str) -> None:
    """Walked as a plain object's field, the optimizer's groups' numbers were made inputs twice: the
    capture refused with a wrong reason, every later call raised, and the groups were left holding
    graphprof's scalars in place of the user's floats."""
    results = []
    for traced in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        holder = _Holder()
        holder.optimizers = [opt] if kept == "list" else {"main": opt}  # type: ignore[attr-defined]
        key: Any = 0 if kept == "list" else "main"

        def step(x: torch.Tensor, holder: _Holder = holder, key: Any = key, model: nn.Module = model) -> torch.Tensor:
            loss = model(x).pow(2).mean()
            loss.backward()
            holder.optimizers[key].step()  # type: ignore[attr-defined]
            holder.optimizers[key].zero_grad()  # type: ignore[attr-defined]
            return loss.detach()
        fn = graphprof.trace(step, profiling=False) if traced else step
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(4):
                loss = fn(torch.randn(3, 8, generator=torch.Generator().manual_seed(i)))
                seen.append((loss, [p.detach().clone() for p in model.parameters()],
                             {k: (type(v), v) for k, v in opt.param_groups[0].items() if k != "params"}))
        if traced:
            assert fn.capture_mode == "whole-step" and fn.captures == 1
        results.append(seen)
    for i, (e, g) in enumerate(zip(*results)):
        assert torch.equal(e[0], g[0]) and all(torch.equal(a, b) for a, b in zip(e[1], g[1])), f"call {i}"
        assert e[2] == g[2], f"call {i}"
