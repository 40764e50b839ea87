"""Whether the step reads a gradient it drops later (``p.grad is not None`` before its ``zero_grad()``).

Why: a replay drops such gradients before its graph runs, or where the step
drops them (capture/grad_drops.py), and nothing of them is in the graph: a
read of their presence is a Python test, baked into the graph, and no op uses
their data (that would keep them). When a replay raises after the drop,
graphprof runs the step again eagerly from the state the replay left
(runtime/failed_replays.py): a step that reads them first would then see
none where eager saw them. So while a capture runs, reads of ``.grad`` on a
parameter whose gradient is still the one the call began with are noted,
when the code reading is not torch's or graphprof's (an optimizer reads
every gradient to drop it). ``nn.Parameter`` gets a ``grad`` property for
that time that reads and writes torch's own attribute.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch
from torch import nn

from graphprof.capture.sources import is_library

#: torch's own attribute (a C descriptor; typed as the value it gives).
_GRAD: Any = torch._C.TensorBase.__dict__["grad"]


class GradReads:
    """The parameters whose entry gradient the step's own code read (``read``: their ids)."""

    def __init__(self, entry: dict[int, Any]) -> None:
        #: id of each parameter with a gradient at the call's start -> that gradient.
        self.entry = entry
        self.read: set[int] = set()

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """Inside: reads of an entry gradient by the user's code are noted."""
        if not self.entry or "grad" in nn.Parameter.__dict__:  # (nothing to note, or a nested capture)
            yield
            return
        entry, read = self.entry, self.read

        def get(p: Any) -> Any:
            grad = _GRAD.__get__(p)
            if grad is not None and entry.get(id(p)) is grad and not is_library(sys._getframe(1).f_code.co_filename):
                read.add(id(p))
            return grad

        def put(p: Any, value: Any) -> None:
            _GRAD.__set__(p, value)

        def drop(p: Any) -> None:
            _GRAD.__delete__(p)

        nn.Parameter.grad = property(get, put, drop, _GRAD.__doc__)  # type: ignore[assignment]
        try:
            yield
        finally:
            del nn.Parameter.grad
