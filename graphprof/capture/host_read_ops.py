"""The torch functions the capture's function mode treats apart from other calls.

A static graph replays ops, not the host: a read of a tensor's value on the
host (``.tolist()``, ``bool(t)``, printing it) would be baked in, so the
capture refuses it, naming what the step did; ``.item()`` becomes a traced
scalar; the backward entry points mark the backward phase; ``F.one_hot``,
whose checks read the host, is rewritten as ops a graph can replay. These
tables are what recorder_modes.py looks functions up in, kept apart so that
what is refused can be read in one place.
"""

from __future__ import annotations

from typing import Any

import torch

from graphprof.capture.copied_values import COPYING_METHODS
from graphprof.capture.host_reads import original

aten = torch.ops.aten
#: The op torch runs where it reads a tensor as a number (``.item()``, a size given as a tensor).
LOCAL_SCALAR_DENSE = aten._local_scalar_dense.default
RECORD_FUNCTION_ENTER = {torch.ops.profiler._record_function_enter_new.default}
RECORD_FUNCTION_EXIT = {torch.ops.profiler._record_function_exit._RecordFunction}
# Host reads of tensor values that a static graph cannot replay.
ITEM = original(torch.Tensor.item)
REFUSED = {
    original(torch.Tensor.tolist): "tolist()",
    original(torch.Tensor.numpy): "numpy()",
    original(torch.Tensor.__bool__): "branching on a tensor",
    original(torch.Tensor.__float__): "float() of a tensor",
    original(torch.Tensor.__int__): "int() of a tensor",
    original(torch.Tensor.__index__): "using a tensor as an index",
    **COPYING_METHODS,
    torch.Tensor.__repr__: "printing a tensor",
    torch.Tensor.__format__: "formatting a tensor",
}
FORMAT = torch.Tensor.__format__
FLOAT = original(torch.Tensor.__float__)
BACKWARD_ENTRIES = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}

ONE_HOT = torch._C._nn.one_hot


def one_hot_by_scatter_applies(args: tuple, kwargs: dict) -> bool:
    """``F.one_hot(y, n)`` of a CPU index tensor with ``n`` given: see ``one_hot_by_scatter``."""
    tensor = args[0] if args else kwargs.get("tensor")
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    return (isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int64 and tensor.device.type == "cpu"
            and type(classes) is int and classes >= 0 and len(args) + len(kwargs) == 2)


def one_hot_by_scatter(tensor: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``F.one_hot(tensor, num_classes)``, as ops a graph can replay: the same tensor (values, dtype,
    strides) and, for a class out of range, the same error.

    Why: torch's ``one_hot`` checks its classes with two ``.item()`` reads on
    the host, so a step using it (a DQN's actions, a custom label smoothing)
    refused capture. The checks become ``_assert_async`` ops with torch's
    own messages (on the CPU they raise at once, as the reads did).
    """
    torch._assert_async((tensor >= 0).all(), "Class values must be non-negative.")
    torch._assert_async((tensor < num_classes).all(), "Class values must be smaller than num_classes.")
    return torch.zeros((*tensor.shape, num_classes), dtype=torch.int64).scatter_(-1, tensor.unsqueeze(-1), 1)


def formats_as_number(tensor: Any) -> bool:
    """A tensor ``format`` writes as its number (``Tensor.__format__``: a plain tensor of one value)."""
    return type(tensor) is torch.Tensor and tensor.dim() == 0 and not tensor.is_meta
