"""Calling a module's compiled forward without dynamo's frame machinery, when that is exactly the same.

Why: entering a ``torch.compile``'d function costs 25-27 us per call on CPU
beyond its guards (measured on a one-layer model, thread CPU time: dynamo's
``compile_wrapper`` saves and restores a dozen pieces of thread state, sets
the frame callback, and the C frame evaluator looks up the cache), while
evaluating the guards themselves costs 13 us. A segmented step pays it once
per traced module forward per call.

What dynamo does on a cache hit is: evaluate the cache entry's guards on the
frame's locals, and if they hold, run the entry's transformed bytecode in
place of the function's. ``DirectEntry`` does the same two things itself,
with the same guard manager and the same bytecode, and only where nothing
else could differ:

* the code object has exactly one cache entry (with several, dynamo's pick
  depends on its most-recently-used order; we leave that to dynamo), and
  it has not been invalidated (dynamo then swaps in an empty guard set);
* the transformed bytecode makes no call dynamo could intercept: it loads
  no global but its one compiled graph and dynamo's own bookkeeping module,
  and builds no function (a graph break's resume function would be compiled
  by dynamo's frame callback, and would not be here);
* dynamo is in its default stance, no frame callback is active (we are not
  inside another compiled region) and nothing is tracing (dynamo, fx, jit).
  When dynamo itself traces the call (a loss module's forward calling the
  model it is given), the entry is not looked at at all: dynamo inlines the
  forward into the caller's graph, as it does any compiled function it meets.

Anything else, and every call whose guards fail, goes through dynamo as
before, so a changed shape, ``requires_grad``, grad mode or module attribute
still recompiles (and is reported) exactly as it would without this. A stale
graph is never run: the guards checked are the ones dynamo would check.

A forward that raises its own error (a shape bug: eager raises
``RuntimeError: mat1 and mat2 shapes cannot be multiplied`` on every call)
fails while dynamo traces it on fake tensors: dynamo raised its
``TorchRuntimeError`` with the meta kernel's message, and its fake tensor
logger printed a traceback eager never prints. When that happens in the
entry's own frame, nothing of the call has run yet: the forward runs
eagerly instead, which raises the user's own error (or returns what eager
returns), and the fake tensor logger is silent while a call compiles.
"""

from __future__ import annotations

import dis
import logging
import types
from typing import Any, Callable

import torch
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list, get_eval_frame_callback
from torch._dynamo import eval_frame
from torch._dynamo.exc import TorchRuntimeError
from torch._dynamo.guards import DeletedGuardManagerWrapper

_OWN_GLOBALS = ("__compiled_fn", "__import_torch_dot__dynamo_dot_utils")
_ALLOWED_CALLS = 3  # record_pregraph_bytecode_enter, the compiled graph, record_pregraph_bytecode_exit
#: Logs every op that fails on fake tensors while dynamo traces (see the module's docstring).
_FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")


def _runs_only_its_graph(code: types.CodeType) -> bool:
    """Whether dynamo's transformed ``code`` calls nothing but its one graph and dynamo's bookkeeping."""
    if any(isinstance(c, types.CodeType) for c in code.co_consts):
        return False  # a resume function (graph break) or another nested function
    graphs = calls = 0
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            if not str(ins.argval).startswith(_OWN_GLOBALS):
                return False
            graphs += str(ins.argval).startswith("__compiled_fn")
        elif ins.opname in ("MAKE_FUNCTION", "IMPORT_NAME", "STORE_GLOBAL", "LOAD_NAME"):
            return False
        elif ins.opname.startswith("CALL") and ins.opname != "CALL_INTRINSIC_1":
            calls += 1
    return graphs == 1 and calls <= _ALLOWED_CALLS


def _dynamo_would_run_cached_code() -> bool:
    """Whether a call of a compiled function now would be a plain cache lookup in dynamo's default stance."""
    stance = eval_frame._stance
    return (stance.stance == "default" and stance.backend is None and get_eval_frame_callback() is None
            and torch._guards.TracingContext.try_get() is None
            and not torch.fx._symbolic_trace.is_fx_symbolic_tracing() and not torch._C._is_tracing())


def _failed_in_frame(exc: TorchRuntimeError, code: types.CodeType) -> bool:
    """Whether dynamo raised ``exc`` while tracing a frame of ``code`` itself (not a graph break's resume
    function, which runs after part of the call has): before any of the call ran."""
    stack = getattr(exc, "real_stack", None)
    first = stack[0] if stack else None
    return first is not None and first.name == code.co_name and first.filename == code.co_filename


class DirectEntry:
    """``entry`` compiled by dynamo, called directly when dynamo's own guards say its one graph applies.

    ``entry`` must take ``(*args, **kwargs)`` and have exactly the free
    variables its closure gives (capture/segmented.py's module entries).
    """

    def __init__(self, entry: Callable[..., Any], compiled: Callable[..., Any]) -> None:
        self._entry = entry
        self._compiled = compiled
        self._eager = torch._dynamo.disable(entry)  # where dynamo failed to trace the forward
        self._code = entry.__code__
        self._free = dict(zip(entry.__code__.co_freevars, (c.cell_contents for c in entry.__closure__ or ())))
        self._known: tuple[types.CodeType, Callable[..., Any] | None] | None = None
        self.direct_calls = 0  # calls that ran the cached graph without entering dynamo (for tests)

    def _direct(self) -> tuple[Any, Callable[..., Any]] | None:
        """The one cache entry's guard manager and its bytecode as a function, or None."""
        entries = _debug_get_cache_entry_list(self._code)
        if len(entries) != 1:
            return None
        cache_entry = entries[0]
        if isinstance(cache_entry.guard_manager, DeletedGuardManagerWrapper) or not isinstance(
                cache_entry.code, types.CodeType):
            return None  # invalidated (a guarded object died): its empty guards would pass anything
        if self._known is None or self._known[0] is not cache_entry.code:
            fn: Callable[..., Any] | None = None
            if _runs_only_its_graph(cache_entry.code):
                fn = types.FunctionType(cache_entry.code, self._entry.__globals__, self._entry.__name__,
                                        None, self._entry.__closure__)
            self._known = (cache_entry.code, fn)
        fn = self._known[1]
        return (cache_entry.guard_manager, fn) if fn is not None else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            # Dynamo is tracing a frame that calls this module (a loss module's ``criterion(model, x)``):
            # it inlines the forward into that frame's graph, as it does any torch.compile'd function it
            # meets. The checks below are host bookkeeping it cannot trace (``get_eval_frame_callback``
            # broke the caller's graph, with a warning eager never gives); it reads this as True.
            return self._compiled(*args, **kwargs)
        direct = self._direct() if _dynamo_would_run_cached_code() else None
        if direct is not None:
            guard_manager, fn = direct
            if guard_manager.check({"args": args, "kwargs": kwargs, **self._free}):
                self.direct_calls += 1
                return fn(*args, **kwargs)
        logged, _FAKE_TENSOR_LOG.disabled = _FAKE_TENSOR_LOG.disabled, True
        try:
            return self._compiled(*args, **kwargs)
        except TorchRuntimeError as exc:
            if not _failed_in_frame(exc, self._code):
                raise
        finally:
            _FAKE_TENSOR_LOG.disabled = logged
        return self._eager(*args, **kwargs)  # outside the handler: its error is not chained to dynamo's
