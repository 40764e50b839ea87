"""Batch norm's cumulative moving average (``momentum=None``): its factor is read by the graph.

Why: torch's ``_BatchNorm.forward`` with ``momentum=None`` counts the batches
it has seen and updates the running statistics with the factor
``1.0 / float(self.num_batches_tracked)``, read right after
``num_batches_tracked.add_(1)``. ``float()`` of the model's state refused
the whole-step capture (capture/value_guards.py: a value that changes on
every call cannot be guarded), so every step with such a norm ran as
segments, with one warning.

How: the read is taken only there, in torch's own ``forward`` (its code
object, so a subclass that overrides ``forward`` is not), for the module's
own count, in training with running statistics: ``float()`` returns the real
number for the capture call, and the factor becomes a number read from a
tensor (``.item()``, capture/scalars.py), computed by nodes as eager
computes it: ``_local_scalar_dense`` of the count where the graph has
advanced it, and ``1.0 /`` that (Python converts the int as ``float()``
does, and as torch's ``float()`` of an int64 tensor does: exactly, below
2**53). The same forward then gives the factor, untouched, to
``F.batch_norm`` as its ``momentum`` (read with the torch version graphprof
pins); that call is given the traced factor instead, so the batch-norm op
node takes the factor's node where it held the number. A replay hands the
kernel the double eager hands it, computed from the count the replay finds:
the same op, the same arithmetic, bitwise the same running statistics. No
tensor arithmetic stands in for the kernel's own.

Batch norm's backward does not use the momentum (``native_batch_norm_backward``
takes no such argument; nor do cuDNN's and MIOpen's), so the factor reaching
the differentiable op is not a number autograd keeps (``unused_by_backward``).
A factor the forward did not pass to batch norm (an error between the read
and the call) refuses the capture at its end: the graph would hold the
capture call's number.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import handle_torch_function

from graphprof.capture.host_reads import past_wrappers
from graphprof.capture.scalars import DataDependentError, TracedScalar

aten = torch.ops.aten

#: The code of torch's ``_BatchNorm.forward``, which reads the factor and passes it on unchanged.
_FORWARD = _BatchNorm.forward.__code__
#: Frames between that forward and a torch function mode handling its ``F.batch_norm`` call.
_DISPATCH_CODES = frozenset({handle_torch_function.__code__, F.batch_norm.__code__})
#: Batch-norm ops and their momentum argument, which their backward does not take.
_MOMENTUM_ARGUMENT = {
    aten.native_batch_norm.default: "momentum",
    aten._native_batch_norm_legit.default: "momentum",
    aten._native_batch_norm_legit_functional.default: "momentum",
    aten.cudnn_batch_norm.default: "exponential_average_factor",
    aten.miopen_batch_norm.default: "exponential_average_factor",
}


class CumulativeAverages:
    """The factors read in ``_BatchNorm.forward`` during one capture, until its ``F.batch_norm`` takes them."""

    def __init__(self, traced_item: Callable[[torch.Tensor], TracedScalar]) -> None:
        self._traced_item = traced_item
        #: Per forward that read its factor and has not yet passed it on: its frame and the factor.
        self._pending: list[tuple[types.FrameType, TracedScalar]] = []

    @property
    def pending(self) -> bool:
        """Whether a forward read its factor and has not yet passed it to batch norm."""
        return bool(self._pending)

    def read(self, tensor: torch.Tensor, frame: types.FrameType | None) -> float | None:
        """``float(tensor)`` in the frame ``frame``: the count's real number when it is the factor's read in
        torch's batch-norm forward (noted, with the factor computed from it), else None."""
        frame = past_wrappers(frame)  # a segmented step's timer may have wrapped ``Tensor.__float__``
        if frame is None or frame.f_code is not _FORWARD:
            return None
        module = frame.f_locals.get("self")
        if (not isinstance(module, _BatchNorm) or module.momentum is not None or not module.training
                or not module.track_running_stats or module.num_batches_tracked is not tensor):
            return None
        count = self._traced_item(tensor)  # Python's ``1.0 / n`` converts ``n`` as ``float(n)`` does
        self._pending.append((frame, 1.0 / count))
        return float(count.value)

    def momentum(self, func: Any, kwargs: dict[str, Any], frame: types.FrameType | None) -> dict[str, Any]:
        """The keyword arguments of a call of ``func`` from ``frame``: with the traced factor as the
        momentum when it is the pending forward's ``F.batch_norm`` with that factor's number."""
        if func is not F.batch_norm or not self._pending:
            return kwargs
        while frame is not None and frame.f_code in _DISPATCH_CODES:
            frame = frame.f_back
        forward, factor = self._pending[-1]
        momentum = kwargs.get("momentum")
        if frame is not forward or type(momentum) is not float or momentum != factor.value:
            return kwargs
        self._pending.pop()
        return {**kwargs, "momentum": factor}

    def settle(self) -> None:
        """The step is done: a factor no batch-norm call took would be the capture call's number."""
        if self._pending:
            frame, factor = self._pending[0]
            self._pending.clear()
            raise DataDependentError(
                f"batch norm's cumulative average factor read at {factor._where} did not reach batch norm, "
                "which a static graph would replay with the capture call's number")


def unused_by_backward(nodes: list[torch.fx.Node], scalar: TracedScalar) -> bool:
    """Whether the nodes of ``nodes`` that take ``scalar`` take it only as a batch-norm op's momentum, which
    that op's backward does not use: autograd keeps no copy of the number."""
    takers = [n for n in nodes if scalar.node in n.all_input_nodes]
    for node in takers:
        name = _MOMENTUM_ARGUMENT.get(node.target)  # type: ignore[call-overload]
        if name is None:
            return False
        place = [a.name for a in node.target._schema.arguments].index(name)  # type: ignore[union-attr]
        if place < len(node.args):
            momentum, rest = node.args[place], (node.args[:place] + node.args[place + 1:], node.kwargs)
        else:
            momentum, rest = node.kwargs.get(name), (node.args, {k: v for k, v in node.kwargs.items() if k != name})
        held: list[torch.fx.Node] = []
        torch.fx.node.map_arg(rest, held.append)
        if momentum is not scalar.node or scalar.node in held:
            return False
    return bool(takers)
