"""An optimizer wrapper that decides on an object it keeps steps as eager does, under every capture.

accelerate's ``AcceleratedOptimizer`` steps its inner optimizer only when
``self.gradient_state.sync_gradients`` is set, which ``accelerator.accumulate``
sets on every call from its own counter. A segmented step's optimizer is
captured on its own (capture/segmented.py): nothing else of the step is in
reach, and the update captured in a synchronising call was replayed in every
accumulating call after it, silently (parameters left eager's from the third
call). The objects a custom optimizer keeps are now watched one level down and
held between calls, so the accumulating calls capture a path of their own.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphprof
from tests.helpers import assert_bitwise_against_eager

CALLS = 7


class Gate:
    """Shared state a wrapper reads: whether this call's gradients are complete."""

    def __init__(self) -> None:
        self.open = False


class GatedOptimizer(torch.optim.Optimizer):
    """A wrapper in accelerate's manner: it keeps the real optimizer and a ``Gate``, and steps only when open."""

    def __init__(self, inner: torch.optim.Optimizer, gate: Gate) -> None:  # no Optimizer.__init__, as accelerate
        self.optimizer = inner
        self.gate = gate

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if self.gate.open:
            self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gate.open:
            self.optimizer.zero_grad(set_to_none)


class Accumulation:
    """Opens the gate every ``every`` calls, like ``accelerator.accumulate``."""

    def __init__(self, gate: Gate, every: int) -> None:
        self.gate, self.every, self.calls = gate, every, 0

    def advance(self) -> None:
        self.calls += 1
        self.gate.open = self.calls % self.every == 0


def _gated_loop() -> tuple[nn.Module, Any]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    gate = Gate()
    opt = GatedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), gate)
    accumulation = Accumulation(gate, 2)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        accumulation.advance()
        loss = nn.functional.mse_loss(model(x), y)
        (loss / accumulation.every).backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, step


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_a_wrapper_that_steps_on_a_kept_gate_updates_only_when_eager_does(capture: str) -> None:
    traced = assert_bitwise_against_eager(_gated_loop, _batch, CALLS, capture=capture, profiling=True)
    assert traced.get_profile().node_count > 0


def _accelerate_loop(progress: bool) -> Any:
    accelerate = pytest.importorskip("accelerate")
    tqdm = pytest.importorskip("tqdm")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    bar = tqdm.tqdm(total=CALLS, file=io.StringIO()) if progress else None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if bar is not None:
            bar.update(1)
        return loss

    return model, step, accelerator, bar


@pytest.mark.parametrize("progress", [False, True], ids=["accumulate", "accumulate with a progress bar"])
def test_an_accelerate_accumulation_loop_matches_eager_call_by_call(progress: bool) -> None:
    """With a progress bar (its open stream refuses the whole-step capture: segments) and without."""
    torch.manual_seed(0)
    model_a, step_a, acc_a, bar_a = _accelerate_loop(progress)
    torch.manual_seed(0)
    model_b, step_b, acc_b, bar_b = _accelerate_loop(progress)
    traced = graphprof.trace(step_b, profiling=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x, y = _batch(i)
            assert torch.equal(step_a(x, y), traced(x, y)), f"loss of call {i}"
            for (name, p), q in zip(model_a.named_parameters(), model_b.parameters()):
                assert torch.equal(p, q), f"{name} after call {i}"
            assert (acc_a.step, acc_a.sync_gradients) == (acc_b.step, acc_b.sync_gradients), f"call {i}"
            if progress:
                assert bar_a.n == bar_b.n == i + 1
    refusals = [w for w in caught if "cannot capture" in str(w.message)]
    assert len(refusals) == (1 if progress else 0), [str(w.message) for w in refusals]
    assert traced.get_profile().meta.capture == ("dynamo" if progress else "fx")


def _borg_loop() -> tuple[nn.Module, Any]:
    """Two instances sharing one ``__dict__`` (the Borg pattern of accelerate's states), both in reach."""

    class Settings:
        shared: dict[str, Any] = {}

        def __init__(self) -> None:
            self.__dict__ = Settings.shared

    first, second = Settings(), Settings()
    first.options = {"scale": 2}
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y) * first.options["scale"] / second.options["scale"]
        loss.backward()
        opt.step()
        return loss

    return model, step


def test_instances_sharing_one_dict_are_watched_once() -> None:
    """Watched once per instance, the second snapshot held the input the first put in the shared
    dict, and no call matched it again: a capture per call, then segments."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no refusal, no storm
        traced = assert_bitwise_against_eager(_borg_loop, _batch, CALLS, profiling=True)
    assert traced.captures == 1


def _accumulating_four(accelerate: Any) -> tuple[nn.Module, Any, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, sched = accelerator.prepare(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s)))
    rates: list[float] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        rates.append(sched.get_last_lr()[0])
        return loss

    return model, step, rates


def test_an_accelerate_loop_accumulating_four_calls_stays_one_step_graph() -> None:
    """Scheduler, clipping on synchronising calls, four accumulating calls: a few paths, then replays,
    each call as eager's (run first: accelerate's gradient state is one per process)."""
    accelerate = pytest.importorskip("accelerate")
    model_a, step_a, rates_a = _accumulating_four(accelerate)
    losses_a = [step_a(*_batch(i)) for i in range(16)]
    model_b, step_b, rates_b = _accumulating_four(accelerate)
    traced = graphprof.trace(step_b, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses_b = [traced(*_batch(i)) for i in range(16)]
    assert all(map(torch.equal, losses_a, losses_b)) and rates_a == rates_b and len(set(rates_b)) == 5
    assert all(map(torch.equal, model_a.parameters(), model_b.parameters()))
    assert traced.get_profile().meta.capture == "fx" and traced.captures <= 5
