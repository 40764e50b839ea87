"""Gradient accumulation as the Hugging Face Trainer and mmengine's OptimWrapper write it: a few graphs, replayed.

An accumulation loop's micro-batches meet gradients absent (the first after
``zero_grad``) or present, and update or not: a handful of paths, each a graph
that replays. Two things made such loops capture on every call until they fell
back to segments:

- the Trainer's loop resets ``self.current_flos = 0`` and then adds floats to
  it, around a ``training_step`` that never reads it; every number reachable
  from the step was held by its type, so int and float took turns breaking the
  graphs. A number no code of the step names, and that the graph does not use,
  decided nothing and is not held (capture/inputs.py, ``PythonState.held``);
- a graph captured before the loop's first update was dropped once that
  update created the optimizer's state, though it neither stepped the
  optimizer nor read its state: the micro-batch path was captured again, and
  with the update's own first graph (which does create the state) and a
  counter's phases, the captures came five in a row (capture/whole_step.py,
  ``optimizer_state_read``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from tests.helpers import assert_modules_equal


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return {"inputs": torch.randn(4, 6, generator=g), "labels": torch.randint(0, 3, (4,), generator=g)}


class _Trainer:
    """The parts of ``transformers.Trainer`` its inner loop touches around ``training_step``."""

    def __init__(self, model: nn.Module, accumulation: int) -> None:
        self.model, self.accumulation = model, accumulation
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        self.current_flos = 0
        self.tr_loss = torch.tensor(0.0)

    def training_step(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        model.train()
        loss = F.cross_entropy(model(inputs["inputs"]), inputs["labels"]) / self.accumulation
        loss.backward()
        return loss.detach()

    def micro_batch(self, step: Callable[..., torch.Tensor], i: int) -> torch.Tensor:
        """One pass of the Trainer's inner loop; ``step`` is ``training_step``, traced or not."""
        inputs = _batch(i)
        loss = step(self.model, inputs)
        self.tr_loss = self.tr_loss + loss
        self.current_flos += float(6 * inputs["inputs"].numel())
        if (i + 1) % self.accumulation == 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.model.zero_grad()
            if (i + 1) % (2 * self.accumulation) == 0:  # logging: the flos are counted, and reset
                self.current_flos = 0
        return loss


class _OptimWrapper:
    """mmengine's ``OptimWrapper.update_params`` with ``accumulative_counts``: the count is the wrapper's."""

    def __init__(self, optimizer: torch.optim.Optimizer, accumulation: int) -> None:
        self.optimizer, self.accumulation, self.inner_count = optimizer, accumulation, 0

    def update_params(self, loss: torch.Tensor) -> None:
        (loss / self.accumulation).backward()
        self.inner_count += 1
        if self.inner_count % self.accumulation == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()


def _assert_few_graphs(traced: Any, caught: list[warnings.WarningMessage], most: int) -> None:
    assert not [w for w in caught if "graphprof" in str(w.message)], [str(w.message) for w in caught]
    assert traced.captures <= most
    assert traced.capture_mode == "whole-step"


@pytest.mark.parametrize("accumulation", [2, 3])
def test_trainer_training_step_alone_replays_with_the_loop_resetting_a_count(accumulation: int) -> None:
    eager, traced_trainer = _Trainer(_model(), accumulation), _Trainer(_model(), accumulation)
    traced = graphprof.trace(traced_trainer.training_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            a = eager.micro_batch(eager.training_step, i)
            b = traced_trainer.micro_batch(traced, i)
            assert torch.equal(a, b) and torch.equal(eager.tr_loss, traced_trainer.tr_loss), f"call {i}"
            assert eager.current_flos == traced_trainer.current_flos
            assert type(eager.current_flos) is type(traced_trainer.current_flos)
            assert_modules_equal(eager.model, traced_trainer.model, f"after call {i}")
    # Gradients absent (after an update) and present: the optimizer's state, created by the loop's
    # first update, changes neither.
    _assert_few_graphs(traced, caught, 2)


@pytest.mark.parametrize("accumulation", [2, 3])
def test_optim_wrapper_counting_inside_the_step_replays(accumulation: int) -> None:
    def make() -> tuple[nn.Module, _OptimWrapper, Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
        model = _model()
        wrapper = _OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), accumulation)

        def train_step(data: dict[str, torch.Tensor]) -> torch.Tensor:
            loss = F.cross_entropy(model(data["inputs"]), data["labels"])
            wrapper.update_params(loss)
            return loss.detach()

        return model, wrapper, train_step

    model_a, wrapper_a, step_a = make()
    model_b, wrapper_b, step_b = make()
    traced = graphprof.trace(step_b)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            a, b = step_a(_batch(i)), traced(_batch(i))
            assert torch.equal(a, b) and wrapper_a.inner_count == wrapper_b.inner_count, f"call {i}"
            assert_modules_equal(model_a, model_b, f"after call {i}")
            for p, q in zip(model_a.parameters(), model_b.parameters()):
                sa, sb = wrapper_a.optimizer.state[p], wrapper_b.optimizer.state[q]
                assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # The first micro-batch after an update (no gradients), the others before an update (gradients:
    # the one captured before the loop's first update is kept), the update.
    _assert_few_graphs(traced, caught, accumulation)
