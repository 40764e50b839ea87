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
path (another line). graphprof's own probes issue no warning (``quiet``).

A host call (an LR scheduler's ``step``, capture/host_calls.py) is Python
the capture runs for real and each replay calls again, from graphprof's
frames: a warning in it (``StepLR.step(epoch)``'s deprecation, torch's
``stacklevel=2``) was blamed on host_calls.py. ``call_blamed`` runs such a
call with ``warn`` wrapped: the frames the call itself runs are the stack's
inner part, as in eager; above them come the step's own frames as they were
when the capture call made the host call (``step_frames``), then the live
callers of graphprof. The capture call hands its warning over as above
(issued at the commit), with no node of its own: every replay's call issues
what it warns, at once, through the same registry.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Iterator, Sequence

import torch

from graphprof.capture.sources import PACKAGE_DIR

#: Frames the capture puts between the step's code and torch's ops: torch's function dispatch and
#: tracer, and graphprof's modes. Not in eager's stack.
_TRACER_FILES = tuple(os.path.join(os.path.dirname(torch.__file__), *part) for part in (
    ("overrides.py",), ("fx",), ("utils", "_python_dispatch.py"), ("_compile.py",),
    ("_dynamo", "eval_frame.py")))
_DISPATCH_FILE = os.path.join(os.path.dirname(torch.__file__), "overrides.py")
#: The frame that calls the step while it is captured, and the folder of the code that calls graphprof.
_CAPTURE_FILE = os.path.join(PACKAGE_DIR, "capture", "whole_step.py")
_ENTRY_DIR = os.path.join(PACKAGE_DIR, "tracing")
#: graphprof's frames that run while an op of the traced step is dispatched (its modes' handlers).
_DISPATCH_HANDLERS = frozenset({"__torch_function__", "__torch_dispatch__"})
#: graphprof's stand-ins that call what eager calls from the same place (``Function.apply``, and the
#: attention and encoder modules' ``forward``, while a step is captured): left out of eager's stack, as if
#: the caller had called torch's own.
_STAND_INS = frozenset({(os.path.join(PACKAGE_DIR, "capture", "custom_functions.py"), "apply"),
                        (os.path.join(PACKAGE_DIR, "capture", "fast_paths.py"), "forward")})


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


#: One frame of eager's stack as ``warn`` blames it: file, line, the module's globals.
Blamed = tuple[str, int, dict[str, Any]]


def _blamed(frame: FrameType) -> Blamed:
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


def eager_stack(frame: FrameType | None) -> list[Blamed] | None:
    """The frames from ``frame`` outwards that eager's stack has, innermost first; None when ``frame``
    is not code of the traced step (graphprof's own, or Python the capture runs outside the trace)."""
    found = _step_part(frame)
    if found is None:
        return None
    stack, capture = found
    return [*map(_blamed, stack), *map(_blamed, _callers_of_graphprof(capture))]


def step_frames(frame: FrameType | None) -> list[Blamed] | None:
    """The traced step's own frames from ``frame`` outwards, at their lines now, without the callers of
    graphprof (a replay has its own); None when ``frame`` is not code of the traced step."""
    found = _step_part(frame)
    return None if found is None else [_blamed(f) for f in found[0]]


def _step_part(frame: FrameType | None) -> tuple[list[FrameType], FrameType] | None:
    """Eager's frames from ``frame`` out to the step's caller, and the capture's frame that calls the
    step; None when ``frame`` is not code of the traced step."""
    if frame is None or frame.f_code.co_filename.startswith(_TRACER_FILES):
        return None  # torch's tracer's own warning: eager has none
    stack: list[FrameType] = []
    dispatched = False  # a frame of torch's function dispatch was left out since the last frame kept
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == _CAPTURE_FILE:  # the step's caller: what lies above is eager's caller's
            return stack, frame
        if (filename, frame.f_code.co_name) in _STAND_INS:
            pass  # a stand-in (checkpoint's Function, an attention module's forward), not in eager's stack
        elif _is_graphprofs(filename):
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


def _is_graphprofs(filename: str) -> bool:
    """Whether a frame of ``filename`` is graphprof's own code (its demo models are the user's)."""
    return filename.startswith(PACKAGE_DIR) and not filename.startswith(PACKAGE_DIR + os.sep + "demo")


def _callers_of_graphprof(frame: FrameType | None) -> list[FrameType]:
    """The frames above the outermost call of graphprof's traced function (eager's step's callers)."""
    outermost = None
    while frame is not None:
        if os.path.dirname(frame.f_code.co_filename) == _ENTRY_DIR:
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
    return None if stack is None else _warning_at(message, category, stacklevel, source, stack)


def _warning_at(message: Any, category: type[Warning] | None, stacklevel: int, source: Any,
                stack: Sequence[Blamed]) -> StepWarning | None:
    """What ``warnings.warn`` would pass to ``warn_explicit`` with ``stack`` (innermost first) above it;
    None where ``warn`` itself raises (a category that is no warning)."""
    if isinstance(message, Warning):
        category = message.__class__
    if category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        return None  # warn's own TypeError, raised by the real call
    if 0 < stacklevel <= len(stack):
        filename, lineno, module_globals = stack[stacklevel - 1]
    else:
        module_globals, filename, lineno = sys.__dict__, "sys", 1  # warn's answer past the stack's end
    registry = module_globals.setdefault("__warningregistry__", {})
    return StepWarning(message, category, filename, lineno, module_globals.get("__name__", "<string>"), registry,
                       module_globals, source)


def call_blamed(outer: Sequence[Blamed], on_warning: Callable[[StepWarning], None], fn: Callable[..., Any],
                *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a host call, with each ``warnings.warn`` it makes blamed where eager blames
    it: on its own frames, then ``outer`` (the step's frames when the capture made the call), then the
    live callers of graphprof; the warning goes to ``on_warning`` (see the module's docstring)."""
    previous = warnings.warn

    def warn(message: Any, category: type[Warning] | None = None, stacklevel: int = 1, source: Any = None,
             **later: Any) -> None:
        stack = None if later else _host_call_stack(sys._getframe(1), outer)
        found = None if stack is None else _warning_at(message, category, stacklevel, source, stack)
        if found is None:  # another thread's, or an argument of a later Python's (``skip_file_prefixes``)
            previous(message, category, stacklevel + 1, source, **later)
            return
        on_warning(found)

    warnings.warn = warn
    try:
        return fn(*args, **kwargs)
    finally:
        warnings.warn = previous


def _host_call_stack(frame: FrameType | None, outer: Sequence[Blamed]) -> list[Blamed] | None:
    """Eager's stack of a warning ``call_blamed``'s call makes from ``frame`` (see ``call_blamed``); None
    when ``frame`` is not inside that call. graphprof's frames in it (a scheduler the capture call's
    patched ``step`` steps inside a ``SequentialLR``) are not eager's."""
    inner: list[Blamed] = []
    while frame is not None and frame.f_code is not call_blamed.__code__:
        if not _is_graphprofs(frame.f_code.co_filename):
            inner.append(_blamed(frame))
        frame = frame.f_back
    if frame is None:
        return None
    return [*inner, *outer, *map(_blamed, _callers_of_graphprof(frame))]


#: Ids of the handles of the global module hooks a capture has registered (capture/recorder.py).
OWN_GLOBAL_HOOKS: set[int] = set()
_GLOBAL_HOOKS_WARNING = "Using `torch.compile(module)` when there are global hooks on modules"


@contextlib.contextmanager
def own_global_hooks(*handles: Any) -> Iterator[None]:
    """Inside: ``handles`` (of global module hooks graphprof registered) count as graphprof's own."""
    ids = [handle.id for handle in handles]
    OWN_GLOBAL_HOOKS.update(ids)
    try:
        yield
    finally:
        OWN_GLOBAL_HOOKS.difference_update(ids)


def about_own_global_hooks(message: Any) -> bool:
    """Whether ``message`` is torch's warning that a ``torch.compile(module)`` is called while global module
    hooks are registered, and the capture's own are the only ones: eager, which has none, never gives it."""
    if not str(message).startswith(_GLOBAL_HOOKS_WARNING):
        return False
    from torch.nn.modules import module
    hooks = (module._global_forward_pre_hooks, module._global_forward_hooks, module._global_backward_pre_hooks,
             module._global_backward_hooks)
    return all(key in OWN_GLOBAL_HOOKS for registered in hooks for key in registered)


def wrapped_warn(original: Callable[..., None], on_warning: Callable[[StepWarning], None]
                 ) -> Callable[..., None]:
    """``warnings.warn`` for the length of a capture: the traced step's warnings go to ``on_warning``,
    and torch's about the capture's own global module hooks nowhere."""

    def warn(message: Any, category: type[Warning] | None = None, stacklevel: int = 1, source: Any = None,
             **later: Any) -> None:
        if about_own_global_hooks(message):
            return
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
