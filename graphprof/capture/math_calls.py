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

Only calls through the module (``math.cos(x)``) are seen; a name imported
from it (``from math import cos``) is the function itself, and its
``float()`` is guarded as before.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

from graphprof.capture.scalars import TracedScalar, recorded_call

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


@contextlib.contextmanager
def traced_math() -> Iterator[None]:
    """Inside: ``math``'s functions of real numbers record a node when given a ``TracedScalar``."""
    originals = {name: getattr(math, name) for name in FUNCTIONS if hasattr(math, name)}
    for name, function in originals.items():
        setattr(math, name, _traced(function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(math, name, function)
