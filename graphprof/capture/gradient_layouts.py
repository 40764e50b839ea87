"""A compiled backward takes each gradient in the layout eager's autograd hands it.

Why: AOTAutograd traces a backward before any gradient exists, guessing
that the gradient of each output will have that output's strides, and at
run time copies a gradient laid out otherwise into those strides
(``coerce_to_expected_memory_format``). Eager's backward formulas run on the
gradient as it comes. The values are the same, but CPU kernels choose their
loop by layout: an elementwise op whose operands are all contiguous along
the inner dimension runs vectorized, others element by element, and the two
round differently in some ops (GELU, ``sigmoid``, ``log1p`` on CPU in
torch 2.13). wav2vec2's positional convolution ends in ``gelu(...)``
transposed back, compiled as a graph of its own when layerdrop makes dynamo
run the encoder's frame eagerly; eager's add handed it a contiguous
gradient, which AOTAutograd copied into the transposed output's layout, and
the GELU backward after it took the other loop: parameters differed from
eager's in the last bits (1e-14 to 4e-8) from the first call, with no
warning, and torch.compile's own ``aot_eager`` backend differs the same way.

So while graphprof's segments are compiled (``eager_gradient_layouts``), the
backward prologue that AOTAutograd generates for them is given a tangent
handler that passes a plain tensor on unchanged; tensor subclasses and
tracing (fake tensors) still go through AOTAutograd's own. The prologue
binds the handler when it is generated, so torch.compile's other graphs, the
user's own, keep AOTAutograd's.

A backward's ``view`` (and ``_unsafe_view``), which raises on a layout it
cannot view, becomes ``reshape``: the same values in any layout
(``reshape_views``). Its other ops compute the same values from any layout,
as eager's formulas do; an ``as_strided`` of a gradient reads it by its
run-time strides, as eager's does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch._dynamo  # before AOTAutograd's runtime, which imports it back: in this order the import resolves
import torch.fx
from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd
from torch._functorch._aot_autograd.schemas import PlainTensorMeta

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _passing_plain_tensors(own: Callable[..., Any]) -> Callable[..., Any]:
    """AOTAutograd's tangent handler, except that a plain tensor is passed on in its own layout."""
    def process_runtime_tangent(x: Any, meta: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        if type(x) is torch.Tensor and isinstance(meta, PlainTensorMeta):
            return x, [x]
        return own(x, meta, *args, **kwargs)

    return process_runtime_tangent


@contextlib.contextmanager
def eager_gradient_layouts() -> Iterator[None]:
    """While AOTAutograd compiles in here, the backwards it makes take gradients in their run-time layouts."""
    own = AOTDispatchAutograd.__dict__["process_runtime_tangent"]
    AOTDispatchAutograd.process_runtime_tangent = staticmethod(  # type: ignore[method-assign]
        _passing_plain_tensors(own.__func__))
    try:
        yield
    finally:
        AOTDispatchAutograd.process_runtime_tangent = own  # type: ignore[method-assign]


def reshape_views(gm: torch.fx.GraphModule) -> None:
    """Make a compiled backward's ``view`` ops ``reshape``: the same values, without the layout check.

    Why: a gradient in another layout than the trace's (handed on as eager
    hands it, above; or computed from tensors laid out otherwise, as in
    Whisper with encoder layerdrop, where a dropped layer leaves the next one
    its input in the permuted layout of the convolutions' output) makes a
    traced ``view`` of it raise where eager runs on; torch.compile's own
    runtime raises there too. A ``reshape`` is that same view wherever the
    view was possible, and a copy of the same values elsewhere; a backward
    graph is functional, so nothing writes through the view.
    """
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _VIEWS]
    for node in views:
        node.target = torch.ops.aten.reshape.default
    if views:
        gm.recompile()

