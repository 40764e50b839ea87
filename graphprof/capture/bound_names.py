"""Functions of a module wrapped for one capture, under every name the user's code calls them by.

Why: a capture replaces some functions of the standard library by wrappers
for as long as it runs (``math``'s, capture/math_calls.py; the clocks,
capture/host_sources.py). Setting the module's attribute reaches code that
writes ``time.perf_counter()``, but a name bound to the function itself
(``from time import perf_counter``, ``from timeit import default_timer as
timer``, ``clock = time.time`` taken before the call, a closure's cell) is
the function, which the attribute does not reach: the wrapper never ran,
and the graph kept the capture call's value. So the globals and closure
cells of the user's functions the step can run (``reachable_locations``'s
walk) that hold one of the wrapped functions hold its wrapper while the
capture runs, and the function again after, unless the step bound the name
to something else meanwhile. ``namespaces`` are module dicts searched the
same way (``timeit``'s ``default_timer`` is ``time.perf_counter``).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterable, Iterator

#: Where a name holds a wrapped function: (a globals dict and its key, or a cell and None; the function;
#: its wrapper).
Binding = tuple[Any, "str | None", Any, Any]


def bound_names(functions: Iterable[types.FunctionType], wrapped: dict[int, Callable[..., Any]],
                namespaces: Iterable[dict[str, Any]] = ()) -> list[Binding]:
    """Where the user's functions (and ``namespaces``) hold one of the ``wrapped`` functions (id -> its
    wrapper) by a name of their own."""
    found: list[Binding] = []
    seen: set[int] = set()
    spaces = list(namespaces)
    for f in functions:
        spaces.append(f.__globals__)
        for cell in f.__closure__ or ():
            if id(cell) in seen:
                continue
            seen.add(id(cell))
            try:
                v = cell.cell_contents
            except ValueError:  # a cell not yet assigned
                continue
            if id(v) in wrapped:
                found.append((cell, None, v, wrapped[id(v)]))
    for space in spaces:
        if id(space) not in seen:
            seen.add(id(space))
            found += [(space, name, v, wrapped[id(v)]) for name, v in space.items() if id(v) in wrapped]
    return found


@contextlib.contextmanager
def wrapped_names(originals: dict[tuple[Any, str], Callable[..., Any]], wrapped: dict[int, Callable[..., Any]],
                  functions: Iterable[types.FunctionType] = (), namespaces: Iterable[dict[str, Any]] = ()
                  ) -> Iterator[None]:
    """Inside: each of ``originals`` ((module, name) -> function) is its wrapper (``wrapped``: id -> wrapper)
    as the module's attribute and under every name ``functions`` and ``namespaces`` bind it to."""
    bindings = bound_names(functions, wrapped, namespaces)
    for (module, name), function in originals.items():
        setattr(module, name, wrapped[id(function)])
    for holder, key, _, wrapper in bindings:
        if key is None:
            holder.cell_contents = wrapper
        else:
            holder[key] = wrapper
    try:
        yield
    finally:
        for (module, name), function in originals.items():
            setattr(module, name, function)
        for holder, key, function, wrapper in bindings:  # unless the step bound the name to something else
            if key is None:
                if holder.cell_contents is wrapper:
                    holder.cell_contents = function
            elif holder.get(key) is wrapper:
                holder[key] = function
