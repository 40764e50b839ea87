"""Timing host reads of tensor data (``.item()``, ``.cpu()``...) in a segmented step's eager code.

Why not ``sys.setprofile``: a profile hook written in Python runs on every
Python call and return of the step, not only on host reads. Between
segments that is AOTAutograd's runtime wrappers, the autograd engine's calls
into the compiled backward, ``zero_grad`` and ``clip_grad_norm_``: on the
demo GPT step the hook alone cost 9% of the step, more than all the probes.

Instead, the few ``torch.Tensor`` methods that read device data on the
host are replaced by thin wrappers that call the original and, while a
probed step runs, note its start and end; nothing else in the step pays
anything. The wrappers return exactly what the originals return (they call
them with the same arguments). They are put on when a probed step starts
and stay while steps are probed (``install`` says why); the first call
without probes, or the traced function being dropped, takes them off.
Torch-function handlers that compare methods (graphprof's capture
recorder) look through them with ``original``. Dynamo
is unaffected: it resolves tensor methods from a table it builds at import
(``all_tensor_attrs``), so it neither traces the wrappers nor guards on them.
Only reads made on the thread that runs the step are recorded, and a read
inside another read (a subclass's ``__torch_function__``) counts once.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._dynamo.eval_frame import skip_code

from graphprof.capture.segment_nodes import caller_source

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
    """Records host reads made on its thread while it is entered (a probed step) and not ``paused``."""

    def __init__(self, record: Callable[[HostRead], None], clock: Callable[[], int]) -> None:
        self.record = record
        self.clock = clock
        self.thread = 0
        self.paused = False
        self._previous: HostReadTimer | None = None

    def __enter__(self) -> "HostReadTimer":
        install()
        self.thread, self.paused = threading.get_ident(), False
        self._previous, _state.timer = _state.timer, self
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.timer = self._previous


class _State:
    """The timer recording now (None: wrappers only call the originals), and what was replaced."""

    timer: HostReadTimer | None = None
    inside = False  # a read is being timed: one inside it (a subclass's __torch_function__) is not
    saved: list[tuple[str, Any]] = []


_state = _State()


def install() -> None:
    """Put the wrappers on ``torch.Tensor``, if they are not there.

    They stay between probed steps: changing ``torch.Tensor``'s attributes
    invalidates the type caches CPython's specialised bytecode and dynamo
    keep, and doing it on every step cost the demo GPT step 3-4% (measured
    in benchmarks/segmented.py's workloads), more than all its probes.
    """
    if _state.saved:
        return
    for name in HOST_READS:
        _state.saved.append((name, torch.Tensor.__dict__.get(name, _MISSING)))
        setattr(torch.Tensor, name, _wrap(name, getattr(torch.Tensor, name)))


def uninstall() -> None:
    """Give ``torch.Tensor`` its own methods back (when no step is being timed)."""
    if _state.timer is not None:
        return
    for name, old in reversed(_state.saved):
        if old is _MISSING:
            delattr(torch.Tensor, name)  # the method is TensorBase's again
        else:
            setattr(torch.Tensor, name, old)
    _state.saved.clear()


def original(func: Any) -> Any:
    """The method a wrapper stands for (``func`` itself otherwise): what torch-function handlers compare."""
    return getattr(func, "__graphprof_original__", func)


def past_wrappers(frame: types.FrameType | None) -> types.FrameType | None:
    """The first frame from ``frame`` outwards that is not a wrapper's: where the step made a host read."""
    while frame is not None and frame.f_code.co_name == "host_read" and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame


def _wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def host_read(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        timer = _state.timer
        if timer is None or timer.paused or _state.inside or threading.get_ident() != timer.thread:
            return method(tensor, *args, **kwargs)
        _state.inside = True
        start = timer.clock()
        try:
            return method(tensor, *args, **kwargs)
        finally:
            end = timer.clock()
            _state.inside = False
            timer.record(HostRead(name, caller_source(sys._getframe(1)), start, end))

    host_read.__graphprof_original__ = original(method)  # type: ignore[attr-defined]
    # A graph break on a read inside a compiled forward calls the wrapper from dynamo's frame callback:
    # left to it, dynamo compiled the wrapper, guarded on the timer's state and recompiled it whenever that
    # changed (and those guard failures were reported as the user's). It only times the original method.
    skip_code(host_read.__code__)  # type: ignore[attr-defined]  # functools.wraps keeps the function's code
    return host_read

