"""Timing host reads of tensor data (``.item()``, ``.cpu()``...) in a segmented step's eager code.

Why not ``sys.setprofile``: a profile hook written in Python runs on every
Python call and return of the step, not only on host reads. Between
segments that is AOTAutograd's runtime wrappers, the autograd engine's calls
into the compiled backward, ``zero_grad`` and ``clip_grad_norm_``: on the
demo GPT step the hook alone cost 9% of the step, more than all the probes.

Instead, while a probed step runs, the few ``torch.Tensor`` methods that
read device data on the host are replaced by thin wrappers that call the
original and note its start and end; nothing else in the step pays
anything. The wrappers return exactly what the originals return (they call
them with the same arguments) and are removed when the step ends. Dynamo
is unaffected: it resolves tensor methods from a table it builds at import
(``all_tensor_attrs``), so it neither traces the wrappers nor guards on them.
Only reads made on the thread that runs the step are recorded, and a read
inside another read (a subclass's ``__torch_function__``) counts once.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from graphprof.capture.segment_nodes import user_source

_TORCH_DIR = os.path.dirname(torch.__file__)
#: Tensor methods that read device data on the host.
HOST_READS = ("item", "numpy", "cpu", "tolist", "__bool__", "__float__", "__int__", "__index__")
_MISSING = object()


@dataclass(frozen=True)
class HostRead:
    """A host read of tensor data in eager code between segments."""

    method: str
    source: str
    start_ns: int
    end_ns: int


class HostReadTimer:
    """Wraps ``torch.Tensor``'s host-read methods while installed; ``paused`` stops recording."""

    def __init__(self, record: Callable[[HostRead], None], clock: Callable[[], int]) -> None:
        self._record = record
        self._clock = clock
        self._thread = 0
        self._saved: list[tuple[str, Any]] = []
        self._inside = False
        self.paused = False

    def install(self) -> None:
        self._thread = threading.get_ident()
        self.paused, self._inside = False, False
        for name in HOST_READS:
            self._saved.append((name, torch.Tensor.__dict__.get(name, _MISSING)))
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))

    def uninstall(self) -> None:
        for name, old in reversed(self._saved):
            if old is _MISSING:
                delattr(torch.Tensor, name)  # the method is TensorBase's again
            else:
                setattr(torch.Tensor, name, old)
        self._saved.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        clock, record = self._clock, self._record

        @functools.wraps(original)
        def host_read(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if self.paused or self._inside or threading.get_ident() != self._thread:
                return original(tensor, *args, **kwargs)
            self._inside = True
            start = clock()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                end = clock()
                self._inside = False
                record(HostRead(name, _frame_source(sys._getframe(1)), start, end))

        return host_read


def _frame_source(frame: Any) -> str:
    """``file:line`` of the innermost user frame (torch may make the call for the user)."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return ""
    return user_source(frame.f_code.co_filename, frame.f_lineno)
