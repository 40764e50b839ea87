"""A traced forward pass whose result is differentiated outside it.

A replay runs the graph under ``no_grad``: a whole-step graph's backward is
explicit. A function that runs no backward and returns a tensor autograd can
still differentiate (``fwd = trace(lambda x: model(x))``, then
``loss_fn(fwd(x), y).backward()`` outside) got back a tensor without a
``grad_fn`` from the first replay on, and the user's backward raised. Such a
function is now profiled as segments, with one warning, and trains as eager.
A step that returns its own dataclass holding its loss, which a replay cannot
rebuild (one with a ``__post_init__``), is told so, in one sentence that names it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def test_a_forward_pass_differentiated_outside_trains_as_eager_with_one_warning() -> None:
    eager_model, model = _model(), _model()
    eager_opt, opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager_model, model))
    forward = graphprof.trace(lambda x: model(x), profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, y = _batch(i)
            for run, o in ((eager_model, eager_opt), (forward, opt)):
                o.zero_grad()
                out = run(x)
                assert out.grad_fn is not None, f"call {i}: the result lost autograd's record"
                F.mse_loss(out, y).backward()
                o.step()
            assert all(torch.equal(p, q) for p, q in zip(eager_model.parameters(), model.parameters())), f"call {i}"
    refusals = [str(w.message) for w in caught if "cannot capture" in str(w.message)]
    assert len(refusals) == 1 and "runs no backward itself" in refusals[0] and "AddmmBackward0" in refusals[0]
    assert forward.capture_mode != "whole-step"


def test_a_forward_pass_under_no_grad_stays_one_graph() -> None:
    model = _model()

    def predict(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x)

    forward = graphprof.trace(predict, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = [forward(_batch(i)[0]) for i in range(CALLS)]
    assert all(torch.equal(out, model(_batch(i)[0]).detach()) for i, out in enumerate(outs))
    assert forward.capture_mode == "whole-step" and forward.captures == 1


@dataclasses.dataclass
class _StepOutput:
    loss: torch.Tensor
    calls: int

    def __post_init__(self) -> None:  # (what makes it one a replay cannot rebuild: test_returned_dataclasses)
        self.logged = self.calls


def test_a_returned_dataclass_holding_the_loss_refuses_with_a_sentence_that_names_it() -> None:
    """It failed deep in make_fx ("a number read at run time ... NotImplementedError"), naming nothing the
    user wrote; the step still runs as segments, with eager's results."""
    def make() -> tuple[Callable[[torch.Tensor], Any], dict[str, int]]:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {"n": 0}

        def step(x: torch.Tensor) -> _StepOutput:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            state["n"] += 1
            return _StepOutput(loss.detach(), state["n"])
        return step, state

    (eager, _), (step, _) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            expected, got = eager(torch.ones(2, 3)), traced(torch.ones(2, 3))
            assert torch.equal(expected.loss, got.loss) and expected.calls == got.calls, f"call {i}"
            assert expected.logged == got.logged, f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "returns a _StepOutput whose loss is a tensor" in messages[0], messages
    assert "no __post_init__" in messages[0]
