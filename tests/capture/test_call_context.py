"""What the caller runs a traced step inside: inference mode, attention backends, modes and hooks.

A graph captured under ``inference_mode`` was replayed under ``no_grad``
and returned inference tensors; one captured with the default attention
kernel was replayed inside ``sdpa_kernel(SDPBackend.MATH)``; and a mode or
``saved_tensors_hooks`` the caller put around a call (``FlopCounterMode``, a
``TorchFunctionMode`` of its own) saw none of a replay's ops. Inference
mode and the attention backends are now part of the graph's key; a call
made inside a mode or saved-tensor hooks runs eagerly, with one warning.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

import graphprof

CALLS = 6


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


def _train() -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    model = _Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.tanh(model(x))
        loss.backward()
        opt.step()
        return loss.detach()
    return step, model


class _SigmoidForTanh(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return (torch.sigmoid if func is torch.tanh else func)(*args, **(kwargs or {}))


def _contexts(kind: str) -> Callable[[int], Any]:
    """The context call ``i`` is made in: the kind on odd calls, none on even ones."""
    def context(i: int) -> Any:
        if i % 2 == 0:
            return contextlib.nullcontext()
        if kind == "attention backend":
            return sdpa_kernel(SDPBackend.MATH)
        if kind == "function mode":
            return _SigmoidForTanh()
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t.to(torch.bfloat16), lambda t: t.float())
    return context


@pytest.mark.parametrize("kind", ["attention backend", "function mode", "saved tensors hooks"])
def test_a_step_called_inside_a_context_of_the_callers_trains_as_eager(kind: str) -> None:
    (eager, eager_model), (step, model) = _train(), _train()
    traced = graphprof.trace(step)
    context = _contexts(kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(CALLS):
            x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(i))
            with context(i):
                expected = eager(x)
            with context(i):
                got = traced(x)
            assert torch.equal(expected, got), f"loss of call {i}"
            assert all(map(torch.equal, eager_model.parameters(), model.parameters())), f"call {i}"
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    if kind == "attention backend":  # a key of its own: one graph per backend set
        assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 2
    else:
        assert len(messages) == 1 and "run eagerly, unprofiled" in messages[0], messages


def test_flop_counter_mode_around_a_traced_step_counts_eagers_flops() -> None:
    """The capture call sent the step's ops through the caller's counter twice, and replays not at all."""
    counts = {}
    for traced in (False, True):
        step, _ = _train()
        fn = graphprof.trace(step) if traced else step
        per_call = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(4):
                x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(i))
                with FlopCounterMode(display=False) as counter:
                    fn(x)
                per_call.append(counter.get_total_flops())
        counts[traced] = per_call
    assert counts[True] == counts[False] and counts[False][0] > 0


def test_an_eval_step_under_inference_mode_and_no_grad_returns_what_eager_returns() -> None:
    """A graph captured under ``inference_mode`` replayed under ``no_grad`` returned an inference tensor,
    and the caller's in-place update of it raised where eager's did not."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    evaluate = graphprof.trace(lambda x: model(x) * 2)
    for i in range(CALLS):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        context = torch.inference_mode() if i % 2 else torch.no_grad()
        with context:
            expected, got = model(x) * 2, evaluate(x)
        assert torch.equal(expected, got) and got.is_inference() == expected.is_inference(), f"call {i}"
        if not got.is_inference():
            got.add_(1)  # the caller's own use of a plain tensor
    assert evaluate.capture_mode == "whole-step"


def test_a_default_device_set_around_the_calls_keys_a_graph_and_is_replayed() -> None:
    """``torch.set_default_device`` is a torch function mode of its own: it only decides where the
    step's factories make tensors, which the graph holds, so those calls still replay."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x) + torch.ones(2)

    traced = graphprof.trace(evaluate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            with torch.device("cpu"):
                assert torch.equal(traced(x), evaluate(x)), f"call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 1
