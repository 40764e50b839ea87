"""Every call after the capture is the user's: three calls give one recorded step.

The capture call compiles the graphs and measures kernel workspace on copies
(runtime/workspace.py), so nothing is left for later calls to do but run the
step; outputs, state and random streams stay those of eager execution.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import graphprof
from graphprof.analysis.steps import step_stats
from graphprof.demo.steps import resnet_sgd_step
from graphprof.runtime.codegen import compile_graph
from tests.helpers import assert_same_state, run_eager, run_traced


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4)).eval()


def test_three_calls_of_an_inference_function_give_one_recorded_step() -> None:
    model = _conv_net()
    x = torch.randn(2, 3, 12, 12)
    expected = model(x).detach()

    @graphprof.trace(profiling=True)
    def infer(inp):
        with torch.no_grad():
            return model(inp)

    outs = [infer(x) for _ in range(3)]
    assert all(torch.equal(o, expected) for o in outs)  # outputs unchanged
    prof = infer.get_profile()
    assert [s.index for s in prof.steps] == [2]
    assert prof.meta.extra["workspace"] == "measured"
    assert any(n.memory is not None and n.memory.workspace_allocated_bytes for n in prof.graphs[0].nodes)


def test_three_calls_of_a_train_step_give_one_recorded_step_and_equal_state() -> None:
    eager, traced = resnet_sgd_step(batch_size=2, image_size=16), resnet_sgd_step(batch_size=2, image_size=16)
    losses = run_eager(eager, 3)
    traced_losses, fn = run_traced(traced, 3, profiling=True)
    assert all(torch.equal(a, b) for a, b in zip(losses, traced_losses))
    assert_same_state(eager, traced)  # running statistics included: the measurement ran on copies
    prof = fn.get_profile()
    assert [s.index for s in prof.steps] == [2]
    graph = prof.graphs[0]
    assert graph.memory_peak.allocated_bytes == sum(
        n.memory.allocated_bytes + n.memory.workspace_allocated_bytes for n in graph.nodes if n.memory is not None)


def test_random_streams_are_untouched_by_the_measurement() -> None:
    torch.manual_seed(3)
    gen = torch.Generator().manual_seed(7)

    def step(x):
        return torch.nn.functional.dropout(x, 0.5) + torch.rand(x.shape, generator=gen)

    eager_gen_state, eager = gen.get_state(), []
    torch.manual_seed(3)
    for _ in range(4):
        eager.append(step(torch.ones(8)))
    gen.set_state(eager_gen_state)
    torch.manual_seed(3)
    traced = graphprof.trace(step, profiling=True)
    outs = [traced(torch.ones(8)) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(eager, outs))
    assert len(traced.get_profile().steps) == 2


def test_under_a_users_profiler_the_profile_says_workspace_was_not_measured() -> None:
    model = nn.Linear(4, 2)
    fn = graphprof.trace(lambda x: model(x).sum().detach(), profiling=True)
    with profile(activities=[ProfilerActivity.CPU]):
        for _ in range(3):
            fn(torch.ones(2, 4))
    note = fn.get_profile().meta.extra["workspace"]
    assert note.startswith("not measured:") and "profiler" in note


def test_the_first_recorded_step_is_not_an_outlier_on_the_demo() -> None:
    demo = resnet_sgd_step(batch_size=4, image_size=16)
    verdicts = []
    # Code generation inside the first recorded step would make it an outlier on every try; a load
    # spike on this shared machine makes one try fail now and then. So: any of three tries passes.
    for _ in range(3):
        fn = graphprof.trace(demo.step_fn, profiling=True)
        for i in range(7):
            fn(*demo.make_inputs(i))
        prof = fn.get_profile()
        assert prof.steps[0].index == 2
        # code generation happened in the capture call: the generated functions already exist
        assert set(fn.runner._executables) == {False, True}
        assert fn.runner.captured._guard_check is not None  # the guards' check too
        first = prof.steps[0].wall_time_s
        stats = step_stats(prof)
        # A step 3x the median would be a compile or a cache miss, not noise. The first replay is
        # 1.05-1.2x the median on this demo (cold caches after the capture call), which the report's
        # outlier rule (10% and 3.5 MADs) flags on some runs: that is not code generation.
        verdicts.append(first < 3 * stats.median_s)
        if verdicts[-1]:
            break
    assert any(verdicts), "the first recorded step was an outlier on three tries"


def test_codegen_binds_replacement_constants() -> None:
    model = nn.Linear(3, 1, bias=False)
    fn = graphprof.trace(lambda x: model(x).detach(), profiling=False)
    x = torch.ones(1, 3)
    for _ in range(2):
        fn(x)
    gm = fn.graph_module
    name = next(n.target for n in gm.graph.nodes if n.op == "get_attr")
    zeros = torch.zeros_like(getattr(gm, name))
    assert torch.equal(compile_graph(gm, {name: zeros})(x)[0][0], torch.zeros(1, 1))
    assert torch.equal(compile_graph(gm)(x)[0][0], model(x).detach())


def test_replacement_constants_need_a_flat_graph() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))  # call_module nodes: not flat
    with pytest.raises(ValueError):
        compile_graph(gm, {"x": torch.zeros(1)})


def test_an_expanded_input_is_measured_on_a_copy_of_the_same_layout() -> None:
    """``position_ids = torch.arange(S).expand(B, -1)`` (a collator's, or HF models' own token type ids):
    elements share memory (stride 0), and copying it for the measurement raised "more than one element
    of the written-to tensor refers to a single memory location" into the capture call."""
    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.ModuleDict({"pos": nn.Embedding(6, 8), "out": nn.Linear(8, 1)})
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step_of(model: nn.Module, opt: torch.optim.Optimizer):
        def step(x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model["out"](x + model["pos"](position_ids)).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    (eager_model, eager_opt), (model, opt) = make(), make()
    eager, traced = step_of(eager_model, eager_opt), graphprof.trace(step_of(model, opt), profiling=True)
    position_ids = torch.arange(6).unsqueeze(0).expand(4, -1)
    for i in range(4):
        x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager(x, position_ids), traced(x, position_ids)), f"call {i}"
        assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"
    assert traced.capture_mode == "whole-step" and traced.get_profile().meta.extra["workspace"] == "measured"


def _linear_twins() -> tuple[Any, ...]:
    """An eager and a traced SGD step on the same linear model, from one seed each."""
    def make() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step_of(model: nn.Module, opt: torch.optim.Optimizer):
        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    (eager_model, eager_opt), (model, opt) = make(), make()
    return step_of(eager_model, eager_opt), eager_model, eager_opt, step_of(model, opt), model, opt


def _assert_twins_equal(eager_model: nn.Module, eager_opt: torch.optim.Optimizer, model: nn.Module,
                        opt: torch.optim.Optimizer, where: str) -> None:
    for p, q in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad), where
        assert torch.equal(eager_opt.state[p]["momentum_buffer"], opt.state[q]["momentum_buffer"]), where


def _run_linear_twins(calls: int) -> tuple[Any, list[str]]:
    """Both twins for ``calls`` calls, compared after each; the traced function and its warnings."""
    eager, eager_model, eager_opt, step, model, opt = _linear_twins()
    traced = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"call {i}"
            _assert_twins_equal(eager_model, eager_opt, model, opt, f"call {i}")
    return traced, [str(w.message) for w in caught]


def test_a_failed_workspace_measurement_loses_its_figures_not_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement runs after the capture call made the step: graphprof's own error there reached
    the caller, as if the step had raised, and the next call captured (and made the step) again."""
    def fails(*args: Any) -> Any:
        raise NotImplementedError("Cannot access storage of SparseTensorImpl")

    monkeypatch.setattr("graphprof.runtime.whole_step_runner.measure_on_copies", fails)
    traced, caught = _run_linear_twins(5)
    assert caught == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    note = traced.get_profile().meta.extra["workspace"]
    assert note == ("not measured: the measurement failed "
                    "(NotImplementedError: Cannot access storage of SparseTensorImpl)")


def test_code_generation_that_fails_falls_back_with_one_warning_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generating the graphs' code is graphprof's own work, done in the capture call: a failure there
    undoes the capture and runs the call eagerly, with one warning that names it, not a crash."""
    def fails(gm: torch.fx.GraphModule, *args: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded while generating code")

    monkeypatch.setattr("graphprof.runtime.whole_step_runner.compile_graph", fails)
    traced, caught = _run_linear_twins(5)
    assert len(caught) == 1 and caught[0].startswith(
        "graphprof: cannot capture step as one static graph: RecursionError: maximum recursion depth exceeded")
    assert traced.capture_mode == "segments"
