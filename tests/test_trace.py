"""The @trace decorator: eager equivalence on real training steps, call protocol, errors."""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch
from torch import nn

import graphprof
from graphprof.capture.errors import CaptureError
from graphprof.demo.steps import cnn_bn_dropout_step, gpt_adam_step, gpt_adamw_step, mlp_sgd_step
from tests.helpers import assert_same_state, run_eager, run_traced

SMALL_GPT = dict(batch_size=2, seq_len=16, n_ctx=16, d_model=32, n_layer=2, n_head=2)
FACTORIES = {
    "mlp-sgd-momentum": lambda: mlp_sgd_step(),
    "cnn-bn-dropout-sgd": lambda: cnn_bn_dropout_step(),
    "gpt-adamw": lambda: gpt_adamw_step(**SMALL_GPT),
    "gpt-adam": lambda: gpt_adam_step(**SMALL_GPT),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_traced_steps_are_bitwise_equal_to_eager(name: str) -> None:
    eager, traced = FACTORIES[name](), FACTORIES[name]()
    steps = 6  # 1 eager warm-up, 1 capture, 4 replayed: every path is compared
    losses_eager = run_eager(eager, steps)
    losses_traced, fn = run_traced(traced, steps, profiling=True)
    for i, (a, b) in enumerate(zip(losses_eager, losses_traced)):
        assert torch.equal(a, b), f"loss of step {i} differs: {a} vs {b}"
    assert_same_state(eager, traced)
    assert len(fn.get_profile().steps) == steps - 2  # every call after the capture is recorded


def test_profiling_false_runs_the_graph_without_probes_and_equal_results() -> None:
    eager, traced = FACTORIES["cnn-bn-dropout-sgd"](), FACTORIES["cnn-bn-dropout-sgd"]()
    losses_eager = run_eager(eager, 5)
    losses_traced, fn = run_traced(traced, 5, profiling=False)
    assert all(torch.equal(a, b) for a, b in zip(losses_eager, losses_traced))
    assert_same_state(eager, traced)
    with pytest.raises(RuntimeError, match="no profiled step"):
        fn.get_profile()


def test_adam_step_count_is_read_at_run_time_not_baked() -> None:
    traced = FACTORIES["gpt-adam"]()
    _, fn = run_traced(traced, 3)
    targets = {str(n.target) for n in fn.graph_module.graph.nodes if n.op == "call_function"}
    assert "aten._local_scalar_dense.default" in targets  # the step's .item() happens in the graph
    assert any(t.startswith("<built-in function pow") for t in targets)  # bias correction in Python floats


def test_decorator_forms() -> None:
    def f(x):
        return x * 2

    for wrapped in (graphprof.trace(f), graphprof.trace(profiling=False)(f), graphprof.trace(f, profiling=True)):
        x = torch.ones(3)
        assert [wrapped(x).tolist() for _ in range(3)] == [[2.0, 2.0, 2.0]] * 3
    assert graphprof.trace(f).__name__ == "f"

    @graphprof.trace
    def g(x):
        return x + 1

    assert g(torch.zeros(1)).item() == 1.0


def test_inference_function_and_new_signature_recaptures() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())

    @graphprof.trace(profiling=True)
    def infer(x):
        with torch.no_grad():
            return model(x)

    for batch in (2, 2, 2, 5, 5, 5):  # the first 5 captures a second graph
        x = torch.randn(batch, 4)
        assert torch.equal(infer(x), model(x).detach())
    addmm = next(n for n in infer.get_profile().graphs[0].nodes if n.type == "addmm")
    assert (5, 4) in addmm.in_shapes  # the profile is of the latest signature


def test_changed_learning_rate_is_honoured() -> None:
    eager, traced = FACTORIES["mlp-sgd-momentum"](), FACTORIES["mlp-sgd-momentum"]()
    fn = graphprof.trace(traced.step_fn)
    torch.manual_seed(0)
    for i in range(6):
        if i == 4:
            eager.optimizer.param_groups[0]["lr"] = 0.01
            traced.optimizer.param_groups[0]["lr"] = 0.01
        assert torch.equal(eager.step_fn(*eager.make_inputs(i)), fn(*traced.make_inputs(i)))
    assert_same_state(eager, traced)


def test_returning_item_value_is_live() -> None:
    w = torch.zeros(3)

    @graphprof.trace
    def step(x):
        w.add_(x)
        return w.sum().item()

    assert [step(torch.ones(3)) for _ in range(4)] == [3.0, 6.0, 9.0, 12.0]


def test_untraceable_step_raises_one_clear_error_and_restores_state() -> None:
    demo = FACTORIES["mlp-sgd-momentum"]()
    printed = []

    def step(x, y):
        loss = demo.step_fn(x, y)
        printed.append(f"{loss.item():.3f}")  # host read a static graph cannot replay
        return loss

    fn = graphprof.trace(step, capture="fx")  # "auto" would fall back to segments instead
    fn(*demo.make_inputs(0))
    before = {k: v.clone() for k, v in demo.model.state_dict().items()}
    with pytest.raises(CaptureError, match=r"cannot capture step.*formatting.*test_trace.py:\d+"):
        fn(*demo.make_inputs(1))
    for k, v in demo.model.state_dict().items():
        assert torch.equal(before[k], v), f"{k} was left half-updated"


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="capture must be one of"):
        graphprof.trace(lambda x: x, capture="bogus")
    with pytest.raises(ValueError, match="cache_size"):
        graphprof.trace(lambda x: x, cache_size=0)


def test_step_without_tensor_arguments() -> None:
    """A step that takes its data from a closure: the graph starts with no placeholder."""
    w = torch.ones(3)

    @graphprof.trace(capture="fx")
    def step():
        w.mul_(0.5)
        return w.sum()

    assert [step().item() for _ in range(5)] == [1.5, 0.75, 0.375, 0.1875, 0.09375]
    assert len(step.get_profile().steps) == 3  # calls 3, 4 and 5 are recorded


class _Trainer:
    """A trainer written as a class and traced itself: ``graphprof.trace(Trainer(...))``."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.n = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.n += 1
        return loss.detach()


def test_a_traced_objects_attributes_are_read_from_it_as_they_are_now() -> None:
    """The wrapper kept a copy of the object's ``__dict__`` from when it was traced: ``traced.n`` stayed
    0 while the trainer counted, and a traced module's ``training`` stayed True after ``eval()``."""
    trainer = _Trainer()
    traced = graphprof.trace(trainer, profiling=False)
    for i in range(3):
        traced(torch.randn(4, 3))
        assert traced.n == trainer.n == i + 1
    assert traced.model is trainer.model and traced.__name__ == "_Trainer"
    model = torch.nn.Linear(3, 1)
    forward = graphprof.trace(model, profiling=False)
    model.eval()
    assert forward.training is False
    with pytest.raises(AttributeError):
        assert forward.no_such_attribute is None


def _warm_up_step() -> tuple[nn.Module, torch.optim.Optimizer, Callable[[torch.Tensor, int], torch.Tensor]]:
    """nanoGPT's loop: the rate from the iteration number, a branch on it (a new path when warm-up ends)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, it: int) -> torch.Tensor:
        for group in opt.param_groups:
            group["lr"] = 0.1 * (it + 1) / 4 if it < 3 else 0.1
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, step


def test_get_profile_after_a_call_that_captured_a_new_path_shows_the_last_recorded_graph() -> None:
    """The capture call of the new path records no step: ``get_profile`` raised "no profiled step yet"
    although the earlier path had recorded two."""
    eager_model, _, eager = _warm_up_step()
    model, _, step = _warm_up_step()
    fn = graphprof.trace(step, profiling=True)
    # eager; capture, replay, replay (warm-up path); capture (the path after warm-up)
    for call, it in enumerate([0, 1, 2, 2, 3]):
        x = torch.full((2, 4), float(call))
        assert torch.equal(eager(x, it), fn(x, it)), f"call {call}"
        assert all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), model.parameters())), f"call {call}"
    assert fn.captures == 2 and len(fn.get_profile().steps) == 2  # calls 3 and 4, on the warm-up path


def test_a_step_that_raises_on_every_call_is_given_up_naming_its_error() -> None:
    """``Adam(capturable=True)`` on CPU raises on every call, eagerly too: no call ever captured, yet the
    warning said the step "captured 5 times in a row, the last time because it runs for the first time"."""
    def make() -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.Adam(model.parameters(), capturable=True)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    fn = graphprof.trace(step)
    messages: list[str] = []
    for call in range(8):
        x = torch.full((2, 4), float(call))
        raised = []
        for run in (eager, fn):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    run(x)
                except AssertionError as exc:
                    raised.append(str(exc))
            messages += [str(w.message) for w in caught if str(w.message).startswith("graphprof")]
        assert len(raised) == 2 and raised[0] == raised[1], f"call {call}"
        assert all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), model.parameters())), f"call {call}"
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad))
    assert len(messages) == 1, messages
    assert "could not be captured 5 times in a row" in messages[0] and "AssertionError: If capturable" in messages[0]
    assert "first time" not in messages[0]


def test_an_attribute_written_through_the_wrapper_reaches_the_traced_object() -> None:
    """Reads went to the object and writes stayed on the wrapper, so ``traced.scale = 0.5`` never
    reached the step, which kept multiplying by the old scale."""
    class Scaled(_Trainer):
        def __init__(self) -> None:
            super().__init__()
            self.scale = 1.0

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return super().__call__(x * self.scale)

    eager, trainer = Scaled(), Scaled()
    traced = graphprof.trace(trainer, profiling=False)
    for i in range(4):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager(x), traced(x)), f"call {i}"
        eager.scale = traced.scale = 0.5 ** (i + 1)
        assert trainer.scale == eager.scale and "scale" not in vars(traced)
    traced.profiling = True  # the wrapper's own settings stay the wrapper's
    assert "profiling" not in vars(trainer)


def test_a_decorated_step_counting_on_its_own_attribute_counts_on_every_call() -> None:
    """``@graphprof.trace`` makes the step's own name the wrapper, so ``step.calls += 1`` in its body wrote
    on the wrapper, whose fields no walk reads: replays did not count, silently."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @graphprof.trace
    def step(x: torch.Tensor) -> torch.Tensor:
        step.calls += 1
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    step.calls = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):
            step(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            assert step.calls == i + 1
    assert step.capture_mode == "whole-step"
