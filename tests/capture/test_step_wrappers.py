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
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof

CALLS = 7
#: How each twin is traced: whole-step replay, segments after a tensor branch, segments asked for.
CAPTURES = [("fx", False)]


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

