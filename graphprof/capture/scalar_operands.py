"""Traced numbers met outside torch's ops: finding them in a call's arguments, and recording a call of them.

Why a module apart from capture/scalars.py: that module defines what a
traced number is and how one reaches a torch op. Other capture modules take
numbers through other doors (a function of ``math`` or numpy, a host call, a
list the step indexes, an optimizer's groups): they ask whether a call's
arguments hold a traced number, and record ``fn(*operands)`` as a node that
a replay calls, with the traced result the capture call's code goes on with.
"""

from __future__ import annotations

from typing import Any, Callable

from graphprof.capture.scalars import TracedScalar


def recorded_call(fn: Callable[..., Any], operands: tuple, where: str | None = None) -> Any:
    """``fn(*operands)`` as a ``TracedScalar`` whose node calls ``fn`` at replay (an operand must be one);
    NotImplemented when an operand is not a number. ``where`` names the result where a message names it
    (by default, where its operands came from)."""
    first = next(op for op in operands if isinstance(op, TracedScalar))
    result = first._record(fn, *operands)
    if where is not None and isinstance(result, TracedScalar):
        result._where = where
    return result


def contains_traced_scalar(tree: Any) -> bool:
    """True when a (nested) argument structure holds a TracedScalar."""
    if isinstance(tree, TracedScalar):
        return True
    if isinstance(tree, (list, tuple)):
        return any(contains_traced_scalar(x) for x in tree)
    if isinstance(tree, dict):
        return any(contains_traced_scalar(x) for x in tree.values())
    return False
