"""Sizes set by data (a boolean mask, ``nonzero``): read in Python or traced into later ops.

Each scenario runs the same step eagerly and traced on batches whose masks
keep a different number of items each call, and compares every call
bitwise: the loss, what the step returns, and the parameters.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


def _masked_steps() -> dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]]:
    def flowing(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        keep = labels != -100
        return F.cross_entropy(m(x)[keep], labels[keep]), 0

    def counted(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        idx = torch.nonzero(labels != -100).squeeze(1)
        return F.cross_entropy(m(x)[idx], labels[idx]), len(idx)

    def mean_of_kept(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (m(x)[labels != -100] ** 2).mean(), 0  # its backward expands the gradient to the count

    def flattened(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        keep = labels != -100
        return F.cross_entropy(m(x)[keep], labels[keep]) + m(x)[keep].flatten().sum() * 0, 0

    def correct_count(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = m(x)
        right = torch.nonzero(logits.argmax(-1) == labels)  # sized by the model's own outputs
        return F.cross_entropy(logits, labels.clamp(min=0)), right.shape[0]

    def class_balanced(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        kept = labels[labels != -100]
        classes, counts = torch.unique(kept, return_counts=True)  # several outputs, each sized by the data
        weight = torch.zeros(3).index_add(0, classes, kept.numel() / counts.float())
        return F.cross_entropy(m(x), labels, weight=weight), len(classes)

    def bce_of_kept(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        keep = labels != -100  # ELECTRA's pretraining loss over the unpadded tokens
        return F.binary_cross_entropy_with_logits(m(x)[:, 0][keep], (labels[keep] == 1).float()), 0

    def std_of_kept(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        kept = m(x)[labels != -100]
        return kept.std() + torch.var(kept, correction=0), 0

    def mean_of_right(m: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        logits = m(x)
        return (logits[logits > logits.median()] ** 2).mean(), 0  # a mask made by the model

    return {"flowing": flowing, "counted": counted, "mean_of_kept": mean_of_kept, "flattened": flattened,
            "correct_count": correct_count, "class_balanced": class_balanced, "bce_of_kept": bce_of_kept,
            "std_of_kept": std_of_kept, "mean_of_right": mean_of_right}


STEPS = _masked_steps()


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x, labels = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    labels[torch.rand(8, generator=g) < 0.4] = -100  # ignored: each batch keeps another number of items
    return x, labels


def _run(name: str, calls: int = 7) -> tuple[graphprof.tracing.TracedFunction, list[str]]:
    loss_of = STEPS[name]

    def make() -> tuple[nn.Module, Callable[..., Any]]:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
            opt.zero_grad()
            loss, count = loss_of(model, x, labels)
            loss.backward()
            opt.step()
            return loss.detach(), count
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step)
    messages: list[str] = []
    for i in range(calls):
        x, labels = _batch(i)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            expected, got = eager(x, labels), traced(x, labels)
        messages += [str(w.message) for w in caught]
        assert torch.equal(expected[0], got[0]) and expected[1] == got[1], f"call {i}: {expected} vs {got}"
        for a, b in zip(eager_model.parameters(), model.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
    return traced, messages


def test_sizes_that_only_flow_from_op_to_op_replay_one_graph() -> None:
    traced, messages = _run("flowing")
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages


def test_a_count_read_in_python_is_guarded_one_graph_per_count() -> None:
    """``len(idx)`` of a ``nonzero`` computed from the labels: a replay returns this call's count."""
    traced, messages = _run("counted")
    assert traced.capture_mode == "whole-step" and not messages
    counts = {int((_batch(i)[1] != -100).sum()) for i in range(1, 7)}  # the first call runs eagerly
    assert len(counts) >= 2 and traced.captures == len(counts)  # one graph per count


def test_an_op_with_several_data_sized_outputs_is_guarded_on_each() -> None:
    """``torch.unique(..., return_counts=True)``: the guard read ``.shape`` of the op's tuple of
    outputs and the capture failed with an AttributeError (segments, an internal-sounding warning)."""
    traced, messages = _run("class_balanced", calls=10)
    assert traced.capture_mode == "whole-step" and not messages, messages


@pytest.mark.parametrize("name", ["mean_of_kept", "flattened", "bce_of_kept", "std_of_kept"])
def test_a_count_traced_into_a_later_op_is_guarded_one_graph_per_count(name: str) -> None:
    """A size or count traced into a later op (``expand`` in a mean's backward, ``flatten``'s ``view``,
    the count ``binary_cross_entropy_with_logits`` divides its gradient by, ``std``'s ``2 / (n - 1)``):
    the mask's count is guarded, computed from the labels alone. The two counting backwards replayed
    the capture call's count on every call, scaling each gradient by it, silently."""
    traced, messages = _run(name)
    assert traced.capture_mode == "whole-step" and not messages, messages
    counts = {int((_batch(i)[1] != -100).sum()) for i in range(1, 7)}
    assert len(counts) >= 2 and traced.captures == len(counts)


def test_a_size_traced_from_a_mask_the_model_makes_refuses_the_capture() -> None:
    """The guard would run the model to count what its mask keeps: not before a replay."""
    traced, messages = _run("mean_of_right")
    assert traced.capture_mode == "segments"
    refusals = [m for m in messages if "cannot capture" in m]
    assert len(refusals) == 1 and "aten.expand.default" in refusals[0], refusals
    assert "sizes its output by its data" in refusals[0] and "model's or optimizer's state" in refusals[0]


def test_a_count_of_what_the_model_got_right_refuses_the_capture() -> None:
    traced, messages = _run("correct_count")
    assert traced.capture_mode == "segments"
    assert any("reading the size of a tensor sized by its data" in m and "model's or optimizer's state" in m
               for m in messages)
