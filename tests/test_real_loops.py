"""Real training loops (issue: a replayed step never silently differs from eager).

Every scenario builds the same loop twice from one seed, runs one copy
eagerly and the other under ``graphprof.trace`` for ``CALLS`` calls, and
compares after every call: losses, parameters, gradients, optimizer state,
scheduler state and the Python values the loop keeps.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import (
    CosineAnnealingLR, LambdaLR, LinearLR, OneCycleLR, ReduceLROnPlateau, SequentialLR,
)

import graphprof
from graphprof.capture.errors import CaptureError

CALLS = 10


@dataclass
class Loop:
    """One copy of a training loop: the step, what it updates, and the Python it keeps."""

    step: Callable[..., Any]
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: Any = None
    #: Called after each step call by the loop itself (a scheduler stepped outside the step).
    after: Callable[[int], None] = lambda i: None
    #: The step's arguments for call i.
    inputs: Callable[[int], tuple] = lambda i: _batch(i)
    #: Python values the user can observe.
    python: Callable[[], Any] = lambda: None
    extras: dict[str, Any] = field(default_factory=dict)


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _warmup(total: int = 12, warmup: int = 4) -> Callable[[int], float]:
    """The lambda ``transformers.get_linear_schedule_with_warmup`` builds."""
    def lr_lambda(current: int) -> float:
        if current < warmup:
            return float(current) / float(max(1, warmup))
        return max(0.0, float(total - current) / float(max(1, total - warmup)))
    return lr_lambda


def _adamw_step(model: nn.Module, opt: torch.optim.Optimizer, sched: Any = None) -> Callable[..., Any]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        return loss
    return step


def _compare(a: Loop, b: Loop, call: int) -> None:
    where = f"after call {call}"
    for (name, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), f"parameter {name} differs {where}"
        assert (p.grad is None) == (q.grad is None), f"grad of {name}: one is None {where}"
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"grad of {name} differs {where}"
    sa, sb = a.opt.state_dict(), b.opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"], f"param_groups differ {where}"
    for k, state in sa["state"].items():
        for key, value in state.items():
            other = sb["state"][k][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, \
                f"optimizer state {k}.{key} differs {where}"
    if a.sched is not None:
        assert a.sched.last_epoch == b.sched.last_epoch, f"scheduler last_epoch differs {where}"
        assert a.sched.get_last_lr() == b.sched.get_last_lr(), f"scheduler lr differs {where}"
        assert a.sched.state_dict().keys() == b.sched.state_dict().keys()
    assert a.python() == b.python(), f"Python values differ {where}: {a.python()} vs {b.python()}"


def run_both(make: Callable[[], Loop], calls: int = CALLS, **options: Any) -> tuple[Any, Loop]:
    """Run eager and traced copies side by side; return the traced function and its loop."""
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    traced = make()
    fn = graphprof.trace(traced.step, **options)
    torch.manual_seed(1)
    eager_rng = torch.get_rng_state()
    traced_rng = eager_rng.clone()
    for i in range(calls):
        torch.set_rng_state(eager_rng)
        la = eager.step(*eager.inputs(i))
        eager.after(i)
        eager_rng = torch.get_rng_state()
        torch.set_rng_state(traced_rng)
        lb = fn(*traced.inputs(i))
        traced.after(i)
        traced_rng = torch.get_rng_state()
        assert type(la) is type(lb)
        if isinstance(la, torch.Tensor):
            assert torch.equal(la, lb), f"loss of call {i} differs: {la} vs {lb}"
        else:
            assert la == lb, f"result of call {i} differs: {la} vs {lb}"
        _compare(eager, traced, i)
    return fn, traced


def _assert_whole_step(fn: Any, captures: int) -> None:
    assert fn.capture_mode == "whole-step"
    assert fn.captures == captures
    profile = fn.get_profile()
    assert profile.steps, "no recorded step"


# -- (a) AdamW + LambdaLR warm-up inside the step + clip_grad_norm_ --------------------------------
def _loop_sched_inside(make_sched: Callable[[torch.optim.Optimizer], Any]) -> Callable[[], Loop]:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        sched = make_sched(opt)
        return Loop(_adamw_step(model, opt, sched), model, opt, sched)
    return make


def test_a_lambda_warmup_scheduler_stepped_inside_the_step() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, loop = run_both(_loop_sched_inside(lambda opt: LambdaLR(opt, _warmup())))
    _assert_whole_step(fn, captures=1)
    assert loop.sched.last_epoch == CALLS
    ops = {n.op for g in fn.get_profile().graphs for n in g.nodes}
    assert "host.LambdaLR.step" in ops  # the scheduler is a timed node of the replay


def test_a_foreach_adamw_counts_its_step_once_during_capture() -> None:
    """make_fx propagates one-element "constants" by running ops on them again: Adam's step count."""
    def make() -> Loop:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=True)
        sched = LambdaLR(opt, _warmup())
        return Loop(_adamw_step(model, opt, sched), model, opt, sched)

    fn, loop = run_both(make)
    _assert_whole_step(fn, captures=1)
    assert all(state["step"].item() == CALLS for state in loop.opt.state.values())


# -- (b) the same scheduler stepped outside the step ---------------------------------------------
def test_b_scheduler_stepped_outside_the_step_does_not_recapture() -> None:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        sched = LambdaLR(opt, _warmup())
        return Loop(_adamw_step(model, opt), model, opt, sched, after=lambda i: sched.step())

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, _ = run_both(make)
    _assert_whole_step(fn, captures=1)
    assert len(fn.get_profile().steps) == CALLS - 2  # every call after the eager one and the capture


# -- (c) CosineAnnealingLR, OneCycleLR (and the metric-reading ReduceLROnPlateau) inside -------------
@pytest.mark.parametrize("make_sched", [
    lambda opt: CosineAnnealingLR(opt, T_max=5),
    lambda opt: OneCycleLR(opt, max_lr=0.05, total_steps=CALLS + 2),
    lambda opt: SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=3), CosineAnnealingLR(opt, T_max=4)],
                             milestones=[3]),
], ids=["cosine", "one-cycle", "sequential"])
def test_c_builtin_schedulers_stepped_inside(make_sched: Callable[[torch.optim.Optimizer], Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, _ = run_both(_loop_sched_inside(make_sched))
    _assert_whole_step(fn, captures=1)


def test_c_reduce_on_plateau_reads_the_metric_at_run_time() -> None:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = ReduceLROnPlateau(opt, patience=0, factor=0.5)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step(loss.item())
            return loss

        loop = Loop(step, model, opt)
        loop.python = lambda: (sched.num_bad_epochs, sched.best, opt.param_groups[0]["lr"])
        return loop

    fn, _ = run_both(make)
    _assert_whole_step(fn, captures=1)


# -- (d) gradient accumulation with a counter in self, and in a closure ------------------------------
class Trainer:
    def __init__(self, accum: int = 3) -> None:
        self.model = _model()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.accum = accum
        self.micro = 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.model(x), y) / self.accum
        loss.backward()
        self.micro += 1
        if self.micro % self.accum == 0:
            self.opt.step()
            self.opt.zero_grad()
        return loss


def test_d_accumulation_counter_in_self() -> None:
    def make() -> Loop:
        t = Trainer()
        return Loop(t.train_step, t.model, t.opt, python=lambda: t.micro)

    fn, loop = run_both(make, calls=12)
    assert loop.python() == 12
    # One graph per path. A graph that only accumulates holds none of AdamW's state, so it is kept
    # across the first step, which creates that state (and makes the stepping graph stale).
    _assert_whole_step(fn, captures=4)


def test_d_accumulation_counter_in_a_closure() -> None:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        micro = 0

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            nonlocal micro
            loss = F.mse_loss(model(x), y) / 2
            loss.backward()
            micro += 1
            if micro % 2 == 0:
                opt.step()
                opt.zero_grad()
            return loss

        return Loop(step, model, opt, python=lambda: micro)

    fn, loop = run_both(make)
    assert loop.python() == CALLS
    _assert_whole_step(fn, captures=2)


def test_d_gradients_the_step_zeroes_itself_are_not_checked_and_the_loop_may_drop_them() -> None:
    """A step that calls ``zero_grad()`` first never reads the gradients it starts with, so a replay
    does not check them: a loop that also drops them between some calls replays one graph."""
    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return Loop(_adamw_step(model, opt), model, opt,
                    after=lambda i: opt.zero_grad(set_to_none=True) if i % 3 == 2 else None)

    fn, loop = run_both(make)
    _assert_whole_step(fn, captures=1)
    assert all(p.grad is not None for p in loop.model.parameters())


def test_d_gradients_that_appear_between_calls_of_an_accumulating_step_capture_again() -> None:
    """The reverse: a step that accumulates (no ``zero_grad``) reads the gradients it starts with;
    when they exist where they did not at capture, the replay must not run the other graph."""
    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        # Gradients are dropped after every second call: calls start with and without them in turn.
        return Loop(step, model, opt, after=lambda i: opt.zero_grad(set_to_none=True) if i % 2 == 1 else None)

    fn, _ = run_both(make)
    _assert_whole_step(fn, captures=2)


# -- (e) the loop index as an int argument --------------------------------------------------------
def test_e_loop_index_argument_keys_one_graph_per_path_not_per_value() -> None:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x: torch.Tensor, y: torch.Tensor, i: int) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            if i % 3 == 0:
                opt.step()
            return loss

        return Loop(step, model, opt, inputs=lambda i: (*_batch(i), i))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, _ = run_both(make, calls=12)
    _assert_whole_step(fn, captures=2)


def test_a_number_autograd_saves_for_backward_is_read_by_the_backward_too() -> None:
    """``loss * scale``: the backward multiplies by ``scale`` in C++, as it is; the graph's backward takes
    each call's number there, one graph for every value (capture/saved_numbers.py)."""
    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def step(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y) * scale
            loss.backward()
            opt.step()
            return loss

        return Loop(step, model, opt, inputs=lambda i: (*_batch(i), 1.0 + i % 2))

    fn, _ = run_both(make)
    _assert_whole_step(fn, captures=1)


# -- (f) logging .item() values into a list and a dict ---------------------------------------------
def test_f_logged_item_values_are_real_numbers_on_every_call() -> None:
    def make() -> Loop:
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        history: list[float] = []
        metrics: dict[str, float] = {}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            out = model(x)
            loss = F.mse_loss(out, y)
            loss.backward()
            opt.step()
            history.append(loss.item())
            metrics["loss"] = loss.item()
            metrics["mean_out"] = out.mean().item()
            return loss

        return Loop(step, model, opt, python=lambda: (list(history), dict(metrics)),
                    extras={"history": history})

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, loop = run_both(make)
    history = loop.extras["history"]
    assert len(history) == CALLS and all(type(v) is float for v in history)
    assert sum(history) > 0  # plain floats: usable outside the step
    _assert_whole_step(fn, captures=1)


# -- (g) an effect graphprof cannot reproduce ---------------------------------------------------------
class LoggingTrainer:
    """Keeps a log of formatted lines: text built from Python numbers is not a graph value."""

    def __init__(self) -> None:
        self.model = _model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.n = 0
        self.log: list[str] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.n += 1
        self.log.append(f"step {self.n} lr {self.opt.param_groups[0]['lr']}")
        return loss


def _loop_logging() -> Loop:
    t = LoggingTrainer()
    return Loop(t.step, t.model, t.opt, python=lambda: (t.n, list(t.log)))


def test_g_unreproducible_effect_falls_back_with_one_warning() -> None:
    with pytest.warns(UserWarning) as caught:
        fn, _ = run_both(_loop_logging)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1, messages
    assert "test_real_loops.py:" in messages[0]  # names the source line
    assert fn.capture_mode == "segments"


def _loop_random_decision() -> Loop:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rng = random.Random(7)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if rng.random() < 0.7:  # Python randomness deciding the step: a replay would repeat one decision
            opt.step()
        return loss

    return Loop(step, model, opt)


def test_g_python_random_numbers_refuse_the_capture() -> None:
    torch.manual_seed(0)
    loop = _loop_random_decision()
    fn = graphprof.trace(loop.step, capture="fx")
    fn(*loop.inputs(0))
    with pytest.raises(CaptureError, match=r"random\.Random\.random.*test_real_loops.py:\d+"):
        fn(*loop.inputs(1))


def test_clock_reads_in_the_step_are_read_again_on_every_replay() -> None:
    import time

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    timer = {"busy_s": 0.0}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        timer["busy_s"] += time.perf_counter() - t0
        return loss

    fn = graphprof.trace(step, capture="fx")
    totals = []
    for i in range(6):
        fn(*_batch(i))
        totals.append(timer["busy_s"])
    increments = [b - a for a, b in zip(totals, totals[1:])]
    assert all(d > 0 for d in increments)
    assert len(set(increments[2:])) == len(increments[2:])  # measured on every replay, not a constant
    assert fn.captures == 1


# -- re-capture storms ------------------------------------------------------------------------
def test_recapture_storm_warns_once_naming_what_changed_and_keeps_profiling() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(x: torch.Tensor, y: torch.Tensor, tag: str) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fn = graphprof.trace(step)
    with pytest.warns(UserWarning) as caught:
        for i in range(12):
            fn(*_batch(i), f"batch-{i}")  # a new string every call: a new signature every call
    storms = [str(w.message) for w in caught if "in a row" in str(w.message)]
    assert len(storms) == 1, storms
    assert "argument 2 (flattened) changed from" in storms[0] and "batch-" in storms[0]
    assert fn.capture_mode == "segments" and fn.get_profile().steps  # still profiled


def test_train_and_eval_modes_keep_one_graph_each() -> None:
    def make() -> Loop:
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        def after(i: int) -> None:
            model.train(i % 2 == 1)  # evaluate-mode steps between training steps

        return Loop(step, model, opt, after=after)

    fn, _ = run_both(make)
    _assert_whole_step(fn, captures=2)


# -- output the step writes ---------------------------------------------------------------------
def test_print_and_logging_in_the_step_write_on_every_replay(capsys: pytest.CaptureFixture[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import sys

    log = logging.getLogger("tests.real_loops")

    def make() -> Loop:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        box = {"n": 0}

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            box["n"] += 1
            if box["n"] % 3 == 0:
                print("step", box["n"], "loss", loss.item(), file=sys.stdout)
            log.info("loss %s at step %d", loss.item(), box["n"])
            return loss

        return Loop(step, model, opt, python=lambda: box["n"])

    with caplog.at_level(logging.INFO, logger="tests.real_loops"):
        torch.manual_seed(0)
        eager = make()
        for i in range(CALLS):
            eager.step(*eager.inputs(i))
        eager_out, eager_log = capsys.readouterr().out, [r.getMessage() for r in caplog.records]
        caplog.clear()
        torch.manual_seed(0)
        traced = make()
        fn = graphprof.trace(traced.step)
        for i in range(CALLS):
            fn(*traced.inputs(i))
        traced_out, traced_log = capsys.readouterr().out, [r.getMessage() for r in caplog.records]
    assert traced_out == eager_out and eager_out.count("\n") == CALLS // 3
    assert [m for m in traced_log if m.startswith("loss")] == eager_log and len(eager_log) == CALLS
    _assert_whole_step(fn, captures=2)
