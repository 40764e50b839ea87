"""``math`` functions of the step's numbers, computed anew by every replay.

Why: a learning-rate schedule written by hand (``lr = min_lr + 0.5 * (1 +
math.cos(math.pi * it / total)) * (max_lr - min_lr)``, assigned to the
optimizer's groups) reads a counter the step advances. Arithmetic on that
counter is recorded (capture/scalars.py), but ``math.cos`` converts its
argument with ``float()``, which took a guard on the counter's value: the
step was captured again on every call, and after five captures it ran as
segments. While a capture runs, the ``math`` module's functions of real
numbers are wrapped: given a ``TracedScalar``, the call is a node of the
graph that calls the same function at replay (the same inputs give the same
float, bit for bit); given plain numbers, they are the functions themselves.

A name imported from it (``from math import cos``) is the function itself,
which the module's wrapping does not reach: the globals and closure cells of
the user's functions the step can run (``reachable_locations``'s walk) that
hold one of these functions hold the wrapper for as long, and the function
again after. Without that, each call captured again, and after five the step
ran as segments.

``numpy.interp`` (yolov5's warmup: ``np.interp(ni, [0, nw], [0.1,
group["initial_lr"] * lf(epoch)])``) is a plain function, not a ufunc, and
made an object array of the step's numbers, which it could not cast:
wrapped the same way, a call of a scalar and two sequences of numbers is a
node that calls it again at replay (its ``numpy.float64``, as eager's); any
other call of it with one of the step's numbers refuses, naming the line.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from typing import Any, Callable, Iterable, Iterator

from graphprof.capture.bound_names import wrapped_names
from graphprof.capture.scalar_operands import recorded_call
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import user_source

#: Functions of real numbers to real numbers (``floor``, ``ceil`` and ``trunc`` reach ``TracedScalar``'s own
#: methods already).
FUNCTIONS = ("acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "copysign", "cos", "cosh",
             "degrees", "erf", "erfc", "exp", "exp2", "expm1", "fabs", "fmod", "gamma", "hypot", "lgamma", "log",
             "log10", "log1p", "log2", "pow", "radians", "remainder", "sin", "sinh", "sqrt", "tan", "tanh")


def _traced(function: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if any(isinstance(a, TracedScalar) for a in args):
            result = recorded_call(function, args)
            if result is not NotImplemented:
                return result
        return function(*args)
    call.__name__ = call.__qualname__ = function.__name__
    call.__doc__ = function.__doc__
    return call


def _interp_of(count: int, x: Any, *points: Any) -> Any:
    """``numpy.interp(x, xp, fp)`` with ``xp`` and ``fp`` (``count`` numbers each) given flat: the node's
    function, called with the replay's numbers."""
    import numpy
    return numpy.interp(x, list(points[:count]), list(points[count:]))


def _numbers(points: Any) -> list[Any] | None:
    """A sequence of numbers (a list, a tuple, a one-dimensional array of reals) as a list, else None."""
    if type(points).__module__ == "numpy" and getattr(points, "ndim", None) == 1 and points.dtype.kind in "fiub":
        points = points.tolist()
    if not isinstance(points, (list, tuple)):
        return None
    return list(points) if all(isinstance(p, (TracedScalar, int, float)) for p in points) else None


def _traced_interp(function: Callable[..., Any]) -> Callable[..., Any]:
    def interp(x: Any, xp: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
        xs, fs = _numbers(xp), _numbers(fp)
        traced = isinstance(x, TracedScalar) or any(isinstance(p, TracedScalar) for p in (xs or []) + (fs or []))
        if not traced and not any(isinstance(p, TracedScalar) for p in _items(xp) + _items(fp)):
            return function(x, xp, fp, *args, **kwargs)
        if (args or any(v is not None for v in kwargs.values()) or xs is None or fs is None
                or not isinstance(x, (TracedScalar, int, float)) or len(xs) != len(fs)):
            raise DataDependentError(
                f"numpy.interp of a number the step computes at {user_source(2)} cannot be replayed by a "
                "static graph (only a number and two lists of numbers of the same length, with no other "
                "argument, are)")
        return recorded_call(_interp_of, (len(xs), x, *xs, *fs))
    interp.__name__ = interp.__qualname__ = function.__name__
    interp.__doc__ = function.__doc__
    return interp


def _items(points: Any) -> list[Any]:
    """The items of a list or tuple (where a number of the step's may hide), else none."""
    return list(points) if isinstance(points, (list, tuple)) else []


@contextlib.contextmanager
def traced_math(functions: Iterable[types.FunctionType] = ()) -> Iterator[None]:
    """Inside: ``math``'s functions of real numbers (and ``numpy.interp``) record a node when given a
    ``TracedScalar``, called through the module or through a name ``functions`` bind them to."""
    originals = {(math, name): getattr(math, name) for name in FUNCTIONS if hasattr(math, name)}
    wrapped = {id(function): _traced(function) for function in originals.values()}
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "interp"):
        originals[(numpy, "interp")] = numpy.interp
        wrapped[id(numpy.interp)] = _traced_interp(numpy.interp)
    with wrapped_names(originals, wrapped, functions):
        yield
