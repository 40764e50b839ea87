"""A step that catches exceptions itself: refused, since a replay would raise what the step catches.

Why: ``try: loss = model(batch) ... except IndexError: return None`` (a bad
batch skipped, an out-of-memory error recovered from) is Python a replay
does not run. The graph was captured on a good batch; on a bad one the
replay raised the op's error to the caller, where eager returned None and
went on. Run as segments, the step's own Python catches it, as in eager.

The step function's own source (and the functions defined in it, such as
an LBFGS closure) is read before anything runs, once per code object: a
``try`` with an ``except`` refuses, a ``try``/``finally`` alone does not
catch anything. Code the step calls (a helper's ``try``, a
``contextlib.suppress``) is found while the capture runs
(``CatchingFrames``): an op that runs inside such a block of code that is
not torch's refuses the capture when the step returns. A ``try`` around a
host read of a tensor alone (no op inside) catches graphprof's refusal of the
read: the recorder notes it, and the capture refuses all the same.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
from types import CodeType, FrameType
from typing import Any, Callable

from torch import nn

from graphprof.capture.locations import called_function
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import file_line, is_library


def refuse_caught_exceptions(fn: Callable[..., Any]) -> None:
    """Refuse the capture when the step's own code has a ``try`` with an ``except`` (see the module)."""
    code = _step_code(fn)
    if code is None:
        return
    line = _first_handler(code)
    if line is not None:
        raise DataDependentError(
            f"the step catches exceptions at {file_line(code.co_filename, line)} (try/except), which a replayed "
            "graph would raise to the caller instead")


def _step_code(fn: Callable[..., Any]) -> CodeType | None:
    """The code object of the function the user traced (a module's ``forward``, a partial's function, a
    callable object's ``__call__``)."""
    target: Any = type(fn).forward if isinstance(fn, nn.Module) else called_function(inspect.unwrap(fn))
    if isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    target = called_function(target)
    target = getattr(target, "__func__", target)
    return getattr(target, "__code__", None)


@functools.lru_cache(maxsize=256)
def _first_handler(code: CodeType) -> int | None:
    """The line of the first ``try`` with an ``except`` in ``code``'s source, or None (no source either)."""
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    kinds = (ast.Try, getattr(ast, "TryStar", ast.Try))  # ``except*`` from Python 3.11
    lines_caught = [n.lineno for n in ast.walk(tree) if isinstance(n, kinds) and getattr(n, "handlers", None)]
    return None if not lines_caught else first + min(lines_caught) - 1


class CatchingFrames:
    """Whether an op ran inside a ``try``/``except`` or a ``contextlib.suppress`` of code the step calls."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._stop = _step_code(fn)
        #: ``file:line`` of the first such block an op ran in.
        self.found: str | None = None

    def note(self) -> None:
        """At an op: look at the frames between it and the step (one dict lookup per frame's code)."""
        if self.found is not None:
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:  # up to the step's own frame (its caller's ``try`` is the caller's)
            blocks = _catching_blocks(frame.f_code)
            if blocks and any(first <= frame.f_lineno <= last for first, last in blocks):
                self.found = file_line(frame.f_code.co_filename, frame.f_lineno)
                return
            if frame.f_code is self._stop:
                return
            frame = frame.f_back

    def refuse(self) -> None:
        if self.found is not None:
            raise DataDependentError(
                f"the step calls code that catches exceptions around its ops at {self.found} (try/except, "
                "contextlib.suppress), which a replayed graph would raise to the caller instead")


@functools.lru_cache(maxsize=4096)
def _catching_blocks(code: CodeType) -> tuple[tuple[int, int], ...]:
    """The file lines of ``code``'s ``try`` bodies that have an ``except``, and of its ``with
    suppress(...)`` bodies; none for torch's, graphprof's and the standard library's code."""
    if is_library(code.co_filename):
        return ()
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ()
    kinds = (ast.Try, getattr(ast, "TryStar", ast.Try))
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.handlers and node.body:
            blocks.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
        elif isinstance(node, ast.With) and any(_is_suppress(item.context_expr) for item in node.items):
            blocks.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return tuple((first + a - 1, first + b - 1) for a, b in blocks)


def _is_suppress(expr: ast.expr) -> bool:
    """``suppress(...)`` or ``contextlib.suppress(...)``."""
    func = expr.func if isinstance(expr, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "suppress") or (
        isinstance(func, ast.Attribute) and func.attr == "suppress")
