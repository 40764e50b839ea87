"""A step that catches exceptions itself runs as segments, where its ``except`` runs as in eager.

``try: ... except IndexError: return None`` skips a bad batch in eager. The
graph captured on a good batch raised the bad batch's error to the caller
instead: the training loop crashed where eager went on.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

import torch
from torch import nn

import graphprof


def _skipping_step() -> tuple[Callable[[torch.Tensor], Any], nn.Module]:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 3)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)

    def step(idx: torch.Tensor) -> Any:
        try:
            loss = emb(idx).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        except IndexError:
            return None  # a bad batch is skipped
    return step, emb


def test_a_step_that_catches_a_bad_batchs_error_skips_it_as_eager_does() -> None:
    (eager, eager_emb), (step, emb) = _skipping_step(), _skipping_step()
    traced = graphprof.trace(step)
    batches = [torch.tensor([1, 2, 3])] * 3 + [torch.tensor([1, 2, 12])] + [torch.tensor([4, 5, 6])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, idx in enumerate(batches):
            expected, got = eager(idx), traced(idx)
            assert (expected is None and got is None) or torch.equal(expected, got), f"call {i}"
            assert torch.equal(eager_emb.weight, emb.weight), f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "catches exceptions at" in messages[0], messages
    lines, first = inspect.getsourcelines(_skipping_step)
    try_line = first + next(i for i, line in enumerate(lines) if line.strip() == "try:")
    assert f"test_caught_exceptions.py:{try_line}" in messages[0]  # names the line of the ``try``


def test_a_try_without_except_is_captured_whole_step() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    done: list[int] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        try:
            return model(x).sum().detach()
        finally:
            done.append(1)

    traced = graphprof.trace(step)
    for _ in range(3):
        traced(torch.ones(2, 3))
    assert traced.capture_mode == "whole-step" and len(done) == 3
