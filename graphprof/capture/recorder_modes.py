"""The two torch modes through which the capture recorder sees the step: one per op, one per call.

make_fx's proxy mode records the aten ops; these modes sit above it for the
length of the capture. The dispatch mode hands every op to
``CaptureRecorder.record_op`` (which writes its ``CaptureRecord``) and
consumes ``record_function`` scopes. The function mode sees the Python-level
calls before they become ops: ``.item()`` and other host reads (traced,
guarded, or refused: host_read_ops.py), ``p.data = ...``, backward entry
points, and numbers passed where torch takes a tensor. They are apart from
recorder.py because they decide what to do with a call, while the recorder
holds what the capture learned.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from graphprof.capture.copied_values import copied_values
from graphprof.capture.cumulative_averages import CumulativeAverages
from graphprof.capture.data_assignments import DataAssignments, is_data_setter
from graphprof.capture.data_sizes import DataSizedTensors
from graphprof.capture.host_read_ops import (
    BACKWARD_ENTRIES, FLOAT, FORMAT, ITEM, ONE_HOT, RECORD_FUNCTION_ENTER, RECORD_FUNCTION_EXIT, REFUSED,
    formats_as_number, one_hot_by_scatter, one_hot_by_scatter_applies,
)
from graphprof.capture.host_reads import original
from graphprof.capture.kept_history import BackwardNodes
from graphprof.capture.parsed_numbers import ParsedNumbers, scalar_tensors
from graphprof.capture.printed_texts import PRINTED_TEXTS, printed_here
from graphprof.capture.saved_numbers import passed_through
from graphprof.capture.scalar_operands import contains_traced_scalar
from graphprof.capture.scalars import DataDependentError, TracedScalar, call_with_scalars
from graphprof.capture.sources import user_source
from graphprof.capture.value_guards import VALUE_READS, ValueGuards


class Recording(Protocol):
    """What the modes need of the recorder they hand the step's calls to (``CaptureRecorder``)."""

    scopes: list[str]
    refusals: list[DataDependentError]
    backwards: int
    backward_depth: int
    backward_nodes: BackwardNodes
    value_guards: ValueGuards
    cumulative_averages: CumulativeAverages
    parsed_numbers: ParsedNumbers
    data_sized: DataSizedTensors
    data_assignments: DataAssignments | None

    def record_op(self, func: Any, args: tuple, kwargs: dict) -> Any: ...

    def traced_item(self, tensor: torch.Tensor) -> TracedScalar: ...


class OpRecordingMode(TorchDispatchMode):
    """Tags every op node make_fx creates; consumes record_function ops."""

    def __init__(self, recorder: Recording) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in RECORD_FUNCTION_ENTER:
            self.recorder.scopes.append(str(args[0]))
            with _disable_current_modes():
                return func(*args, **kwargs)
        if func in RECORD_FUNCTION_EXIT:
            if self.recorder.scopes:
                self.recorder.scopes.pop()
            with _disable_current_modes():
                return func(*args, **kwargs)
        trace = sys.gettrace()
        if trace is None or getattr(func, "namespace", None) not in _BUILTIN_NAMESPACES:
            return self.recorder.record_op(func, args, kwargs)
        # Recording a built-in op is torch's and graphprof's Python only: no user code runs in it, so
        # the trace of the user's name loads (capture/name_reads.py) is paused, not paid per call.
        sys.settrace(None)
        try:
            return self.recorder.record_op(func, args, kwargs)
        finally:
            sys.settrace(trace)


#: Namespaces of ops torch implements itself (a user's Python custom op is traced like user code).
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "c10d", "_c10d_functional"})


class HostReadMode(TorchFunctionMode):
    """Python-level view: ``.item()``, backward entry points, refused host reads."""

    def __init__(self, recorder: Recording) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        func = original(func)  # a segmented step's host-read timer may have wrapped the method
        if func is ITEM:
            return self.recorder.traced_item(args[0])
        if is_data_setter(func) and self.recorder.data_assignments is not None:
            return self.recorder.data_assignments.assign(func, *args)
        if func in VALUE_READS:
            factor_count = self.recorder.cumulative_averages.read(args[0], sys._getframe(1)) if func is FLOAT else None
            if factor_count is not None:  # batch norm's ``1.0 / float(num_batches_tracked)``
                return factor_count
            try:
                return self.recorder.value_guards.read(func, args[0], user_source(2))
            except DataDependentError as exc:
                self.recorder.refusals.append(exc)
                raise
        if func is ONE_HOT and one_hot_by_scatter_applies(args, kwargs):
            return one_hot_by_scatter(*args, **kwargs)
        if func is FORMAT and formats_as_number(args[0]) and PRINTED_TEXTS and printed_here():
            # ``print(f"loss {loss:.4f}")``: torch formats a 0-dim tensor as its ``.item()``
            return format(self.recorder.traced_item(args[0]), *args[1:])
        refused = REFUSED.get(func) or copied_values(func, args, kwargs)
        if refused is not None:
            error = DataDependentError(f"{refused} at {user_source(2)} reads a tensor's value on the host, "
                                       "which a static graph cannot replay")
            self.recorder.refusals.append(error)
            raise error
        if func in BACKWARD_ENTRIES:
            self.recorder.backwards += 1
            self.recorder.backward_depth += 1
            self.recorder.backward_nodes.enter(func, args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                self.recorder.backward_nodes.exit()
                self.recorder.backward_depth -= 1
        if self.recorder.data_sized.read_by_step(func, args):
            return self.recorder.value_guards.read_sizes(func, args, kwargs, user_source(2))
        if self.recorder.cumulative_averages.pending:  # its forward's ``F.batch_norm`` takes the traced factor
            kwargs = self.recorder.cumulative_averages.momentum(func, kwargs, sys._getframe(1))
        if contains_traced_scalar(args) or contains_traced_scalar(kwargs):
            if passed_through(func):  # its body gives them to the one op that takes them
                return func(*args, **kwargs)
            return call_with_scalars(func, args, kwargs)
        tensors = scalar_tensors(args, kwargs)
        if tensors:  # torch's argument parser may read one as a number
            return self.recorder.parsed_numbers.call(func, args, kwargs, tensors)
        return func(*args, **kwargs)
