"""A step that catches exceptions itself runs as segments, where its ``except`` runs as in eager.

``try: ... except IndexError: return None`` skips a bad batch in eager. The
graph captured on a good batch raised the bad batch's error to the caller
instead: the training loop crashed where eager went on.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

import pytest
import torch
from torch import nn

import graphprof
from tests.helpers import assert_bitwise_against_eager


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


def test_an_error_caught_in_a_function_the_step_calls_refuses_the_capture() -> None:
    """``contextlib.suppress`` (or a ``try`` in a helper) around a lookup: the step's own source has no
    ``try``. A bad batch on the call that captures took the caught path, and every later good batch
    replayed it; an op that raises during the capture now refuses it."""
    import contextlib

    def make() -> Callable[[torch.Tensor], Any]:
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3)

        def lookup(idx: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(())
            with contextlib.suppress(IndexError):
                out = emb(idx).sum()
            return out

        def step(idx: torch.Tensor) -> Any:
            return lookup(idx).detach()
        return step

    eager, step = make(), make()
    traced = graphprof.trace(step)
    batches = [torch.tensor([1, 2]), torch.tensor([1, 12]), torch.tensor([3, 4]), torch.tensor([5, 6])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, idx in enumerate(batches):
            assert torch.equal(eager(idx), traced(idx)), f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "catches" in messages[0], messages


@pytest.mark.parametrize("where", ["helper", "suppress in the step"])
def test_an_op_inside_a_catching_block_refuses_the_capture_before_any_bad_batch(where: str) -> None:
    """The bad batch comes on a replay, after the optimizer's update: the replay could neither catch the
    error as the helper (or the step's ``contextlib.suppress``) does, nor run the step again. Found while
    the good batch is captured: the step runs as segments from the start, as eager does."""
    import contextlib

    def make() -> Callable[[torch.Tensor], Any]:
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)

        def safe_lookup(idx: torch.Tensor) -> torch.Tensor:
            try:
                return emb(idx).sum()
            except IndexError:
                return torch.zeros(())

        def step(idx: torch.Tensor) -> Any:
            opt.zero_grad()
            emb(idx[:1]).sum().backward()
            opt.step()
            if where == "helper":
                extra = safe_lookup(idx)
            else:
                extra = torch.zeros(())
                with contextlib.suppress(IndexError):
                    extra = emb(idx).sum()
            return extra.detach()
        return step

    eager, traced = make(), graphprof.trace(make())
    batches = [torch.tensor([1, 2])] * 3 + [torch.tensor([1, 12]), torch.tensor([4, 5])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, idx in enumerate(batches):
            assert torch.equal(eager(idx), traced(idx)), f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "catches exceptions around its ops" in messages[0], messages
    assert traced.capture_mode == "segments"


def _is_set(flag: torch.Tensor, handler: str) -> bool:
    """A helper that guards a host read with a ``try``: no op runs inside it, so nothing there is seen
    catching around an op; graphprof's refusal of the read is what it catches."""
    try:
        return bool(flag)
    except RuntimeError:
        if handler == "raise":
            raise ValueError("the mean could not be read") from None
        return False


@pytest.mark.parametrize("handler", ["return False", "raise"])
def test_a_refusal_the_steps_code_catches_still_refuses_the_capture(handler: str) -> None:
    """The helper caught graphprof's refusal of ``bool(mean > 25)`` and went on with False: the capture
    call's path became the graph, and every replay took it whatever the timesteps drawn. Or it raised its
    own error, which eager never raises. The refusal made during the capture is final either way."""
    def make() -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            t = torch.randint(0, 50, (3,))
            scale = t.float() / 50
            if _is_set(t.float().mean() > 25, handler):
                scale = scale * 2
            loss = (model(x).squeeze(1) * scale).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(
            make, lambda i: (torch.randn(3, 4, generator=torch.Generator().manual_seed(i)),), calls=6)
    messages = [str(w.message) for w in caught if str(w.message).startswith("graphprof")]
    assert len(messages) == 1 and "branching on a tensor" in messages[0], messages
    assert traced.capture_mode == "segments"
