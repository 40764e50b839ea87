"""Printed tensors: a replay prints eager's text, autograd suffix included.

``print(loss)`` in a replay printed ``tensor(0.3040)`` where eager printed
``tensor(0.3040, grad_fn=<MeanBackward0>)``. The text is rebuilt from the
replayed value's own text (``with_suffix``); the first tests hold it to
torch's text over shapes, dtypes, magnitudes and line widths.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from typing import Any, Callable, Iterator

import pytest
import torch

import graphprof
from graphprof.capture.printed_tensors import autograd_suffix, with_suffix
from graphprof.capture.scalars import DataDependentError


def _tensors() -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64):
        for shape in ((), (1,), (3,), (7, 2), (2, 9), (3, 18), (40,), (1000,), (2, 3, 4), (0,), (0, 3)):
            for scale in (1.0, 1e-6, 1e8):
                base = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
                yield base.requires_grad_() * 1  # a grad_fn: MulBackward0
                yield base.detach().requires_grad_()  # a leaf: requires_grad=True


@pytest.fixture(params=[80, 40, 120, 20])
def linewidth(request: pytest.FixtureRequest) -> Iterator[int]:
    torch.set_printoptions(linewidth=request.param)
    yield request.param
    torch.set_printoptions(profile="default")


def test_the_rebuilt_text_is_torchs_own(linewidth: int) -> None:
    checked = wrapped = 0
    for tensor in _tensors():
        suffix = autograd_suffix(tensor, "here")
        assert suffix is not None
        expected = repr(tensor)
        assert with_suffix(repr(tensor.detach()), suffix) == expected, (tensor.dtype, tuple(tensor.shape), linewidth)
        checked += 1
        wrapped += f",\n       {suffix})" in expected
    assert checked == 330 and wrapped > 0  # both of torch's placements were met


def test_a_tensor_without_autograd_has_no_suffix_and_a_subclass_refuses() -> None:
    assert autograd_suffix(torch.ones(2), "here") is None
    param = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(DataDependentError, match="prints a Parameter with autograd history at here"):
        autograd_suffix(param, "here")


class _Stdout:
    """A logging stream that writes wherever ``sys.stdout`` is at the time (the redirect below)."""

    def write(self, text: str) -> None:
        sys.stdout.write(text)

    def flush(self) -> None:
        pass


_LOG = logging.getLogger("graphprof.tests.printed")
_LOG.propagate = False
_LOG.addHandler(logging.StreamHandler(_Stdout()))
_LOG.setLevel(logging.INFO)


def _printed(body: Callable[[torch.Tensor, torch.Tensor], None], traced: bool) -> tuple[list[str], Any, list[str]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        out = model(x)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        body(loss, out)
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                fn(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)))
            lines.append(text.getvalue())
    return lines, fn, [str(w.message) for w in caught if "graphprof" in str(w.message)]


@pytest.mark.parametrize("body", [
    lambda loss, out: print(loss),
    lambda loss, out: print("step", {"loss": loss, "out": [out]}),
    lambda loss, out: print(out.repeat(1, 12)),
    lambda loss, out: print(out.shape, out.dtype, out.device),
    lambda loss, out: _LOG.info("loss %s out %r", loss, out),
    lambda loss, out: _LOG.info("loss %.4f", loss),
], ids=["loss", "containers", "wide", "dtype", "log-text", "log-number"])
def test_a_replay_prints_eagers_text(body: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    eager, _, _ = _printed(body, traced=False)
    lines, traced, messages = _printed(body, traced=True)
    assert lines == eager
    assert traced.capture_mode == "whole-step" and traced.captures == 1 and not messages
