"""Warnings the step's Python issues, issued again on every replay where eager issues them.

Why: ``warnings.warn`` is Python. A replayed graph runs none of the step's
Python, so a warning the step (or torch's Python between it and the ops:
``F.mse_loss`` on a target of another size) issues on every eager call was
issued once, by the capture call, and never again: under
``simplefilter("always")`` or a test that records warnings the two differ,
and under ``"error"`` eager raises where the replay went on. The capture
call's own warning was also misplaced: torch's function modes put frames
between the warning and the step, so its ``stacklevel`` named a line of
torch's tracer, a new location that the default filter showed once more.

How: while a step is captured, ``warnings.warn`` is wrapped. A warning issued
from the traced step finds the frame eager's ``warn`` would blame by walking
the stack eager would have (``eager_stack``: without graphprof's and the
tracer's frames, each function re-entered by torch's function dispatch once,
and the step's callers above it). Its arguments for ``warn_explicit`` are
fixed then: message, category, file, line, module, that module's registry.
The capture call issues it when the capture is committed, in order with its
printed output; a capture refused later runs the step another way, which
issues it itself. Where the filters turn it into an error, it is raised at
once, as eager raises it. A host node at its place in the graph issues it
again on every replay, through the same registry, so that the filters (the
user's, as they are at that time) decide as they decide for eager: once per
location under ``"default"``, every time under ``"always"``, an error
under ``"error"``.

A call made while the filters turn one of a graph's warnings into an
error runs eagerly (``CapturedStep.raises_a_warning``): eager raises at the
warning with what it ran before in place, which a replay stopped partway
could not leave. A step whose own code changes the filters (``catch_warnings``,
``simplefilter``, ``filterwarnings``) is refused (capture/host_sources.py):
a replay would issue its warnings under the caller's filters, and eager's
change makes every registry forget what it showed.

Not covered: warnings issued by C code (``TORCH_WARN`` of an op's
arguments), which do not call ``warnings.warn``; those of an op's kernel
are issued again by the replay, which runs the kernel, blamed on the
replay's line. ``warn_explicit`` called directly, and a ``warn`` bound
before the capture (``from warnings import warn``). A ``stacklevel`` reaching into
``nn.Module.__call__``, which the capture's hooks send down torch's other
path (another line). Python the capture runs outside the trace (a
scheduler's ``step``, run again as a host call; graphprof's own probes)
issues its warnings as it always did.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Iterator

import torch

#: Frames the capture puts between the step's code and torch's ops: torch's function dispatch and
#: tracer, and graphprof's modes. Not in eager's stack.
_TRACER_FILES = tuple(os.path.join(os.path.dirname(torch.__file__), *part) for part in (
    ("overrides.py",), ("fx",), ("utils", "_python_dispatch.py"), ("_compile.py",),
    ("_dynamo", "eval_frame.py")))
_DISPATCH_FILE = os.path.join(os.path.dirname(torch.__file__), "overrides.py")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The frame that calls the step while it is captured, and the one that calls graphprof.
_CAPTURE_FILE = os.path.join(_PACKAGE_DIR, "capture", "whole_step.py")
_ENTRY_FILE = os.path.join(_PACKAGE_DIR, "tracing.py")
#: graphprof's frames that run while an op of the traced step is dispatched (its modes' handlers).
_DISPATCH_HANDLERS = frozenset({"__torch_function__", "__torch_dispatch__"})
#: graphprof's stand-ins that call what eager calls from the same place (``Function.apply`` while a step
#: is captured): left out of eager's stack, as if the caller had called torch's own.
_STAND_INS = frozenset({(os.path.join(_PACKAGE_DIR, "capture", "custom_functions.py"), "apply")})


@dataclass(frozen=True)
class StepWarning:
    """One ``warnings.warn`` of the step, as ``warn_explicit``'s arguments, blamed where eager blames it."""

    message: Any  # a str or a Warning instance
    category: type[Warning]
    filename: str
    lineno: int
    module: str
    registry: dict[Any, Any]
    module_globals: dict[str, Any] | None
    source: Any

    #: The registry's filter version after the last ``issue`` (one item: the record is frozen).
    issued: list[Any] = field(default_factory=lambda: [None], compare=False)

    def issue(self) -> None:
        warnings.warn_explicit(self.message, self.category, self.filename, self.lineno, self.module,
                               self.registry, self.module_globals, self.source)
        self.issued[0] = self.registry.get("version")

    def ignored(self) -> bool:
        """Whether the filters of now ignore it."""
        return self._action() == "ignore"

    def raises(self) -> bool:
        """Whether the filters of now turn it into an error (``"error"``), which eager raises at once."""
        return self._action() == "error"

    def silent_again(self) -> bool:
        """Whether issuing it again now would show nothing: the filters ignore it, or it was shown and its
        registry, unchanged since, keeps it (the default filter, ``"once"``, ``"module"``)."""
        if self.ignored():
            return True
        key = (str(self.message), self.category, self.lineno)
        return bool(self.registry.get(key)) and self.registry.get("version") == self.issued[0] is not None

    def _action(self) -> str:
        text = str(self.message)
        for action, pattern, category, module, line in warnings.filters:
            if (_matches(pattern, text) and issubclass(self.category, category) and _matches(module, self.module)
                    and (line == 0 or line == self.lineno)):
                return str(action)
        return str(warnings.defaultaction)  # type: ignore[attr-defined]


def _matches(pattern: Any, text: str) -> bool:
    """A filter's message or module test, as ``warnings`` makes it: None matches all, a plain string
    (Python's own startup filters, ``'__main__'``) only itself, a regex from its start."""
    if pattern is None:
        return True
    if isinstance(pattern, str):
        return pattern == text
    return pattern.match(text) is not None


def eager_stack(frame: FrameType | None) -> list[FrameType] | None:
    """The frames from ``frame`` outwards that eager's stack has, innermost first; None when ``frame``
    is not code of the traced step (graphprof's own, or Python the capture runs outside the trace)."""
    if frame is None or frame.f_code.co_filename.startswith(_TRACER_FILES):
        return None  # torch's tracer's own warning: eager has none
    stack: list[FrameType] = []
    dispatched = False  # a frame of torch's function dispatch was left out since the last frame kept
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == _CAPTURE_FILE:  # the step's caller: what lies above is eager's caller's
            return stack + _callers_of_graphprof(frame)
        if (filename, frame.f_code.co_name) in _STAND_INS:
            pass  # a custom autograd Function's forward (checkpoint's input check), as eager's stack has it
        elif filename.startswith(_PACKAGE_DIR) and not filename.startswith(_PACKAGE_DIR + os.sep + "demo"):
            if frame.f_code.co_name not in _DISPATCH_HANDLERS:
                return None  # graphprof's own code, or what it runs outside the trace
            dispatched = True
        elif filename.startswith(_TRACER_FILES):
            dispatched = dispatched or filename == _DISPATCH_FILE
        elif dispatched and stack and stack[-1].f_code is frame.f_code:
            dispatched = False  # the call torch's dispatch entered again (``stack[-1]``): one frame in eager
        else:
            dispatched = False
            stack.append(frame)
        frame = frame.f_back
    return None  # not under a capture


def _callers_of_graphprof(frame: FrameType | None) -> list[FrameType]:
    """The frames above the outermost call of graphprof's traced function (eager's step's callers)."""
    outermost = None
    while frame is not None:
        if frame.f_code.co_filename == _ENTRY_FILE:
            outermost = frame
        frame = frame.f_back
    callers: list[FrameType] = []
    frame = outermost.f_back if outermost is not None else None
    while frame is not None:
        callers.append(frame)
        frame = frame.f_back
    return callers


def step_warning(message: Any, category: type[Warning] | None, stacklevel: int, source: Any,
                 caller: FrameType | None) -> StepWarning | None:
    """What eager's ``warnings.warn(message, category, stacklevel, source)`` called from ``caller`` would
    pass to ``warn_explicit``; None when ``caller`` is not the traced step's code."""
    stack = eager_stack(caller)
    if stack is None:
        return None
    if isinstance(message, Warning):
        category = message.__class__
    if category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        return None  # warn's own TypeError, raised by the real call
    if 0 < stacklevel <= len(stack):
        frame = stack[stacklevel - 1]
        module_globals: dict[str, Any] = frame.f_globals
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
    else:
        module_globals, filename, lineno = sys.__dict__, "sys", 1  # warn's answer past the stack's end
    registry = module_globals.setdefault("__warningregistry__", {})
    return StepWarning(message, category, filename, lineno, module_globals.get("__name__", "<string>"), registry,
                       module_globals, source)


def wrapped_warn(original: Callable[..., None], on_warning: Callable[[StepWarning], None]
                 ) -> Callable[..., None]:
    """``warnings.warn`` for the length of a capture: the traced step's warnings go to ``on_warning``."""

    def warn(message: Any, category: type[Warning] | None = None, stacklevel: int = 1, source: Any = None,
             **later: Any) -> None:
        found = None if later else step_warning(message, category, stacklevel, source, sys._getframe(1))
        if found is None:  # not the step's, or an argument of a later Python's (``skip_file_prefixes``)
            original(message, category, stacklevel + 1, source, **later)
            return
        on_warning(found)

    warn.__wrapped__ = original  # type: ignore[attr-defined]
    return warn


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warning shown while graphprof runs code of its own choosing (a probe of a fused path), without
    ``catch_warnings``: changing the filters makes every module's registry forget what it showed, so the
    default filter would show the step's warnings once more after the capture. Python's ``warn`` is a
    no-op meanwhile, which writes no registry; C code's warnings are not shown."""
    warn, show = warnings.warn, warnings._showwarnmsg  # type: ignore[attr-defined]
    warnings.warn = lambda *args, **kwargs: None
    warnings._showwarnmsg = lambda msg: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        warnings.warn, warnings._showwarnmsg = warn, show  # type: ignore[attr-defined]
