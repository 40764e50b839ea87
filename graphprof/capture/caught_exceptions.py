"""A step that catches exceptions itself: refused, since a replay would raise what the step catches.

Why: ``try: loss = model(batch) ... except IndexError: return None`` (a bad
batch skipped, an out-of-memory error recovered from) is Python a replay
does not run. The graph was captured on a good batch; on a bad one the
replay raised the op's error to the caller, where eager returned None and
went on. Run as segments, the step's own Python catches it, as in eager.

Only the step function's own source (and the functions defined in it, such
as an LBFGS closure) is read, once per code object: a ``try`` with an
``except`` refuses, a ``try``/``finally`` alone does not catch anything.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from types import CodeType
from typing import Any, Callable

from torch import nn

from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import file_line


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
    """The code object of the function the user traced (a module's ``forward``, a partial's function)."""
    target: Any = type(fn).forward if isinstance(fn, nn.Module) else inspect.unwrap(fn)
    if isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
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
