"""``math`` functions and numpy ufuncs of the step's numbers are computed by every replay
(capture/math_calls.py, ``TracedScalar.__array_ufunc__``).

A cosine learning-rate schedule written in the step (nanoGPT's ``get_lr``)
took ``float()`` of the iteration counter inside ``math.cos``: a guard on the
counter's value, so every call captured again, and the sixth ran as segments.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import graphprof


def _cosine_step(cos: Callable[[float], float]) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module,
                                                         torch.optim.Optimizer, dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept: dict[str, Any] = {"it": 0, "norms": []}

    def get_lr(it: int) -> float:
        if it < 3:  # linear warmup
            return 1e-3 * (it + 1) / 3
        ratio = (it - 3) / 20
        return 1e-4 + 0.5 * (1.0 + cos(math.pi * ratio)) * (1e-3 - 1e-4)

    def step(x: torch.Tensor) -> torch.Tensor:
        lr = get_lr(kept["it"])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        kept["norms"].append(math.sqrt(loss.item()))  # a number read from a tensor, through math
        kept["it"] += 1
        return loss.detach()
    return step, model, opt, kept


def _run(step: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, opt: torch.optim.Optimizer,
         kept: dict[str, Any], calls: int) -> list[tuple[Any, ...]]:
    seen = []
    for i in range(calls):
        loss = step(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
        lr = opt.param_groups[0]["lr"]
        seen.append((loss.clone(), [p.detach().clone() for p in model.parameters()], lr, type(lr),
                     list(kept["norms"]), kept["it"]))
    return seen


def _assert_same(expected: list[tuple[Any, ...]], got: list[tuple[Any, ...]]) -> None:
    for i, (e, g) in enumerate(zip(expected, got)):
        assert torch.equal(e[0], g[0]), f"call {i}"
        assert all(torch.equal(a, b) for a, b in zip(e[1], g[1])), f"call {i}"
        assert e[2:] == g[2:], f"call {i}"


@pytest.mark.parametrize("cos", [lambda x: math.cos(x), np.cos], ids=["math", "numpy"])
def test_a_cosine_schedule_written_in_the_step_replays_one_graph_per_branch(cos: Callable[[Any], Any]) -> None:
    """``math.cos`` (looked up in the module at each call) or numpy's ufunc, whose float64 the
    optimizer's group keeps, as in eager."""
    expected = _run(*_cosine_step(cos), calls=12)
    step, model, opt, kept = _cosine_step(cos)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(traced, model, opt, kept, calls=12)
    _assert_same(expected, got)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 2  # the warmup's branch and the cosine's
    ops = {getattr(n.target, "__name__", "") for n in traced.runner.graph_module.graph.nodes}
    assert {"cos", "sqrt"} <= ops  # computed by the replay, from its own numbers
    assert expected[-1][3] is (float if cos is not np.cos else np.float64)


def test_math_is_itself_again_outside_the_capture() -> None:
    original = math.cos
    step, model, opt, kept = _cosine_step(lambda x: math.cos(x))
    traced = graphprof.trace(step, profiling=False)
    _run(traced, model, opt, kept, calls=3)
    assert math.cos is original and math.sqrt(4.0) == 2.0


def test_a_function_imported_from_math_replays_one_graph_per_branch() -> None:
    """``from math import cos`` binds the function itself, here in a closure cell: the cell holds the
    wrapper while the capture runs, so the schedule replays as ``math.cos(...)`` does, and the cell
    holds ``cos`` again after."""
    from math import cos

    expected = _run(*_cosine_step(cos), calls=12)
    step, model, opt, kept = _cosine_step(cos)
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(traced, model, opt, kept, calls=12)
    _assert_same(expected, got)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step" and traced.captures <= 3
    get_lr = next(c.cell_contents for c in step.__closure__ or () if callable(c.cell_contents)
                  and getattr(c.cell_contents, "__name__", "") == "get_lr")
    assert [c.cell_contents for c in get_lr.__closure__ or () if c.cell_contents is cos] == [cos]


_GLOBAL_SCHEDULE = """
from math import cos, pi

def get_lr(it):
    return 1e-4 + 0.5 * (1.0 + cos(pi * it / 20)) * (1e-3 - 1e-4)
"""


def test_a_global_imported_from_math_replays_and_is_itself_again() -> None:
    """The same name as a module global (a schedule module's ``from math import cos``)."""
    import types

    module = types.ModuleType("schedule_module")
    exec(compile(_GLOBAL_SCHEDULE, "schedule_module.py", "exec"), module.__dict__)

    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module, torch.optim.Optimizer, dict[str, Any]]:
        step, model, opt, kept = _cosine_step(math.cos)
        get_lr = module.get_lr  # ``from schedule_module import get_lr``

        def scheduled(x: torch.Tensor) -> torch.Tensor:
            for group in opt.param_groups:
                group["lr"] = get_lr(kept["it"])
            return step(x)
        return scheduled, model, opt, kept

    expected = _run(*make(), calls=8)
    scheduled, model, opt, kept = make()
    traced = graphprof.trace(scheduled, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(traced, model, opt, kept, calls=8)
    _assert_same(expected, got)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step" and traced.captures <= 3
    assert module.cos is math.cos


def _warmup_step(interp_kwargs: dict[str, Any]) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module,
                                                        torch.optim.Optimizer, dict[str, Any]]:
    """yolov5's warmup: ``numpy.interp`` of the iteration counter between two lists that hold the
    groups' ``initial_lr``, into the groups' lr and momentum, and the accumulation count rounded."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.01, momentum=0.937, nesterov=True)
    opt.add_param_group({"params": model[1].parameters(), "weight_decay": 5e-4})
    lf = lambda x: (1 - x / 10) * (1.0 - 0.01) + 0.01  # noqa: E731
    torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    kept: dict[str, Any] = {"it": 0, "accumulate": 1, "norms": []}

    def step(x: torch.Tensor) -> torch.Tensor:
        ni, xi = kept["it"], [0, 4]
        if ni <= 4:
            kept["accumulate"] = max(1, np.interp(ni, xi, [1, 8 / 4]).round())
            for j, group in enumerate(opt.param_groups):
                group["lr"] = np.interp(ni, xi, [0.1 if j == 0 else 0.0, group["initial_lr"] * lf(0)],
                                        **interp_kwargs)
                group["momentum"] = np.interp(ni, xi, [0.8, 0.937])
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept["norms"].append(np.interp(loss.item(), [0.0, 1.0], [0.0, 2.0]))  # a number read from a tensor
        kept["it"] += 1
        return loss.detach()
    return step, model, opt, kept


def _warmup_run(step: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, opt: torch.optim.Optimizer,
                kept: dict[str, Any], calls: int) -> list[tuple[Any, ...]]:
    seen = []
    for i in range(calls):
        loss = step(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
        groups = [(g["lr"], type(g["lr"]), g["momentum"], type(g["momentum"])) for g in opt.param_groups]
        seen.append((loss.clone(), [p.detach().clone() for p in model.parameters()], groups,
                     kept["accumulate"], type(kept["accumulate"]), [(n, type(n)) for n in kept["norms"]]))
    return seen


def test_numpy_interp_of_the_steps_numbers_replays_as_eager() -> None:
    """The groups end up holding eager's ``numpy.float64`` values, bit for bit, on every call."""
    expected = _warmup_run(*_warmup_step({}), calls=8)
    step, model, opt, kept = _warmup_step({})
    traced = graphprof.trace(step, profiling=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _warmup_run(traced, model, opt, kept, calls=8)
    _assert_same(expected, got)
    assert [str(w.message) for w in caught if "graphprof" in str(w.message)] == []
    assert traced.capture_mode == "whole-step"
    assert expected[2][2][1][1] is np.float64 and expected[2][3] == 2.0 and expected[2][4] is np.float64 and expected[0][4] is int
    assert np.interp is np.lib._function_base_impl.interp  # itself again outside the capture


def test_numpy_interp_with_other_arguments_refuses_naming_the_line() -> None:
    expected = _warmup_run(*_warmup_step({"left": 0.0}), calls=3)
    step, model, opt, kept = _warmup_step({"left": 0.0})
    traced = graphprof.trace(step, profiling=False)
    with pytest.warns(UserWarning, match=r"numpy.interp of a number the step computes at \S*test_math_calls.py:\d+ "
                                         "cannot be replayed by a static graph"):
        got = _warmup_run(traced, model, opt, kept, calls=3)
    _assert_same(expected, got)
    assert traced.capture_mode != "whole-step"
