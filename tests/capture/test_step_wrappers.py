"""A ``step`` the user set on an optimizer object runs on every call, as in eager, under every capture.

Users count or log optimizer steps by replacing the bound method on the
object (``inner = opt.step; opt.step = counted``). A replayed whole-step
graph never walked that wrapper (the optimizer's ``step`` field was taken
for torch's), so its counter counted the capture call only; a segmented
step routed the optimizer's step past it, so it never ran at all. Both
silently: the parameters matched, the user's counts and logs did not.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from graphprof.capture.segment_timeline import OptimizerRun

CALLS = 7
#: How each twin is traced: whole-step replay, segments after a tensor branch, segments asked for.
CAPTURES = [("fx", False), ("auto", True), ("dynamo", False)]


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(3, 4, generator=g) for _ in range(CALLS)]


def _loop(wrap: Callable[[torch.optim.Optimizer, dict[str, Any]], None], branch: bool,
          optimizer: str = "Adam") -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
    """A model, its optimizer and StepLR, the optimizer's step wrapped by ``wrap``; the step and what it keeps."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    kept: dict[str, Any] = {"calls": 0, "lrs": [], "model": model, "opt": opt, "sched": sched}
    wrap(opt, kept)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        if branch and torch.isnan(loss):  # a tensor branch: the step runs as segments
            loss = loss * 0
        opt.step()
        sched.step()
        return loss.detach()

    return step, kept


def _counting(opt: torch.optim.Optimizer, kept: dict[str, Any]) -> None:
    inner = opt.step

    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        kept["calls"] += 1
        return inner(*args, **kwargs)

    opt.step = counted  # type: ignore[method-assign]


def _logging_lr(opt: torch.optim.Optimizer, kept: dict[str, Any]) -> None:
    inner = opt.step

    def logged(*args: Any, **kwargs: Any) -> Any:
        kept["lrs"].append(opt.param_groups[0]["lr"])
        return inner(*args, **kwargs)

    opt.step = logged  # type: ignore[method-assign]


def _assert_twins(wrap: Callable[[torch.optim.Optimizer, dict[str, Any]], None], capture: str,
                  branch: bool) -> Any:
    """Run an eager and a traced twin; after every call their results, parameters, optimizer and scheduler
    state and the wrapper's count and log are equal. Returns the traced function."""
    eager_step, eager = _loop(wrap, branch)
    traced_step, traced = _loop(wrap, branch)
    fn = graphprof.trace(traced_step, capture=capture)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fall back to segments says why; what is compared is the state
        for i, x in enumerate(_inputs()):
            where = f"after call {i}"
            assert torch.equal(eager_step(x), fn(x)), f"loss differs {where}"
            assert traced["calls"] == eager["calls"] and traced["lrs"] == eager["lrs"], \
                f"the wrapper's effects differ {where}: {traced['calls']}, {traced['lrs']} vs eager's " \
                f"{eager['calls']}, {eager['lrs']}"
            for a, b in zip(eager["model"].parameters(), traced["model"].parameters()):
                assert torch.equal(a, b), f"parameters differ {where}"
            for a, b in zip(eager["opt"].state.values(), traced["opt"].state.values()):
                assert all(torch.equal(a[k], b[k]) for k in a), f"optimizer state differs {where}"
            assert eager["sched"].state_dict() == traced["sched"].state_dict(), f"scheduler differs {where}"
    assert fn.capture_mode == ("whole-step" if capture == "fx" else "segments"), fn.capture_mode
    return fn


@pytest.mark.parametrize("capture,branch", CAPTURES)
def test_a_counting_wrapper_counts_every_call(capture: str, branch: bool) -> None:
    _assert_twins(_counting, capture, branch)


@pytest.mark.parametrize("capture,branch", CAPTURES)
def test_a_wrapper_logging_the_learning_rate_logs_every_calls_rate(capture: str, branch: bool) -> None:
    _assert_twins(_logging_lr, capture, branch)


def test_the_step_a_wrapper_calls_is_still_profiled_in_segments() -> None:
    """The wrapper runs, and the optimizer's step it calls is the routed whole-step graph, profiled."""
    fn = _assert_twins(_counting, "dynamo", False)
    assert any(isinstance(e, OptimizerRun) and e.stamps for e in fn._segmented.capture.timeline.events)


#: The step a script's module-level wrapper calls (``_script_counted``), as ``inner = opt.step`` at a script's top.
_script_inner: Any = None
_script_calls = [0]


def _script_counted(*args: Any, **kwargs: Any) -> Any:
    _script_calls[0] += 1
    return _script_inner(*args, **kwargs)


def _script_run(capture: str | None) -> tuple[int, list[torch.Tensor]]:
    """A script's loop whose wrapper keeps the step it replaced in a global: its count, and the parameters."""
    global _script_inner
    step, kept = _loop(lambda opt, kept: None, branch=False)
    opt = kept["opt"]
    _script_inner, _script_calls[0] = opt.step, 0
    opt.step = _script_counted  # type: ignore[method-assign]
    fn = graphprof.trace(step, capture=capture) if capture else step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # StepLR's: its wrapper is no longer opt.step, in eager too
        for x in _inputs():
            fn(x)
    if capture:
        assert any(isinstance(e, OptimizerRun) and e.stamps for e in fn._segmented.capture.timeline.events)
    return _script_calls[0], [p.detach().clone() for p in kept["model"].parameters()]


def test_a_wrapper_keeping_its_step_in_a_global_runs_and_its_step_is_routed() -> None:
    eager_calls, eager_params = _script_run(None)
    calls, params = _script_run("dynamo")
    assert calls == eager_calls == CALLS
    assert all(torch.equal(a, b) for a, b in zip(eager_params, params))


def test_a_wrapper_the_step_installs_in_a_segmented_call_stays_installed() -> None:
    """A step that sets ``opt.step`` itself keeps it, as in eager: the routed step graphprof put in
    place for the call was given back over it."""
    def installing(opt: torch.optim.Optimizer, kept: dict[str, Any]) -> None:
        kept["install"] = lambda: _counting(opt, kept)

    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
        step, kept = _loop(installing, branch=False)

        def installs_at_call_2(x: torch.Tensor) -> torch.Tensor:
            kept["seen"] = kept.get("seen", 0) + 1
            if kept["seen"] == 2:
                kept["install"]()
            return step(x)

        return installs_at_call_2, kept

    (eager_step, eager), (traced_step, traced) = make(), make()
    fn = graphprof.trace(traced_step, capture="dynamo")
    for i, x in enumerate(_inputs()):
        assert torch.equal(eager_step(x), fn(x))
        assert traced["calls"] == eager["calls"], f"after call {i}"


@pytest.mark.parametrize("installed_at", [1, 3])
def test_a_wrapper_set_or_taken_off_between_calls_is_a_new_capture(installed_at: int) -> None:
    """A wrapper put on the optimizer after the capture (or taken off after a capture with it) runs on
    the calls after, as in eager: the graph captured without it replayed the update without its count."""
    def run(traced: bool) -> list[int]:
        step, kept = _loop(lambda opt, kept: None, branch=False)
        opt, counts = kept["opt"], []
        fn = graphprof.trace(step, capture="fx") if traced else step
        for i, x in enumerate(_inputs()):
            if i == installed_at:
                _counting(opt, kept)
            if i == 5:
                del opt.step
            fn(x)
            counts.append(kept["calls"])
        return counts

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # StepLR's: its wrapper is no longer opt.step, in eager too
        assert run(True) == run(False)


@pytest.mark.parametrize("capture", ["fx", "dynamo"])
def test_a_wrapper_bound_to_the_optimizer_counts_on_it(capture: str) -> None:
    """``opt.step = MethodType(counted, opt)`` counting in ``self.calls``: a field the user set on one of
    torch's optimizers, which the walk took for torch's own and a replay never counted."""
    def bound_counter(opt: torch.optim.Optimizer, kept: dict[str, Any]) -> None:
        inner = opt.step
        opt.calls = 0  # type: ignore[attr-defined]

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return inner(*args, **kwargs)

        opt.step = types.MethodType(counted, opt)  # type: ignore[method-assign]

    (eager_step, eager), (traced_step, traced) = _loop(bound_counter, False), _loop(bound_counter, False)
    fn = graphprof.trace(traced_step, capture=capture)
    for i, x in enumerate(_inputs()):
        assert torch.equal(eager_step(x), fn(x)), f"loss differs after call {i}"
        assert traced["opt"].calls == eager["opt"].calls == i + 1, f"after call {i}"
