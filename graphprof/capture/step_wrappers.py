"""A ``step`` the user set on an optimizer object, around the step it replaced: kept, and its call routed.

Users count or log optimizer steps by replacing the bound method on the
object (``inner = opt.step; opt.step = counted``, ``counted`` calling
``inner``). A segmented step routes each optimizer's ``step`` to a whole-step
graph of its own (capture/segmented.py), and it did so by putting the routed
step where the user's wrapper was: the wrapper never ran, its counter stayed
at the eager calls' count and its log missed every segmented call, silently.

So the user's wrapper stays ``opt.step`` and runs, and only the step it calls
is routed: the closure cell or global of the wrapper (or of the function a
bound wrapper or a partial runs) that holds the optimizer's own step (its
class's ``step`` bound to it, or an LR scheduler's wrapper of it) holds the
routed step while the segmented call runs. A wrapper that reaches its step another
way (``type(self).step(self)``) runs that step eagerly, as Python: eager's
results, without the update's ops in the profile.

Torch's and libraries' wrappers (an LR scheduler's, accelerate's) are not the
user's: those are replaced by the routed step, as before.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any

import torch

from graphprof.capture.locations import Location, called_function, cell_location, item_location, wrapper_chain


def function_of(step: Any) -> Any:
    """The function a ``step`` set on an object runs: a partial's, a bound method's, a callable object's."""
    target = called_function(step)
    while isinstance(target, functools.partial):
        target = target.func
    return getattr(target, "__func__", target)


def users_wrapper(step: Any) -> bool:
    """Whether ``step``, found in an optimizer's ``__dict__``, is the user's code (not torch's, not a library's).

    Why not ``_wrapped_by_lr_sched``: ``functools.wraps`` copies the function's
    ``__dict__``, so a user's wrapper around an LR scheduler's carries its mark.
    """
    return bool(wrapper_chain(function_of(step)))


def _steps_of(optimizer: torch.optim.Optimizer, value: Any) -> bool:
    """Whether ``value`` is ``optimizer``'s own step: its class's bound to it, or an LR scheduler's
    wrapper of it (which keeps a weak reference to the optimizer it wraps)."""
    if isinstance(value, types.MethodType):
        return value.__self__ is optimizer and value.__func__ is type(optimizer).step
    if not isinstance(value, types.FunctionType) or not hasattr(value, "_wrapped_by_lr_sched") or users_wrapper(value):
        return False
    return any(_filled(cell) and isinstance(cell.cell_contents, weakref.ref) and cell.cell_contents() is optimizer
               for cell in value.__closure__ or ())


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - whether it can be read is the question
    except ValueError:  # a name the function's scope has not bound yet
        return False
    return True


def route_wrapped_step(wrapper: Any, optimizer: torch.optim.Optimizer,
                       routed: Any) -> list[tuple[Location, Any]] | None:
    """Put ``routed`` where ``wrapper``'s functions keep ``optimizer``'s own step, in a closure cell or a
    global their code names (a script's ``inner = opt.step`` at module level): the (place, step)
    pairs to put back once the call is over, or None where no such place holds it."""
    swapped: list[tuple[Location, Any]] = []
    for function in wrapper_chain(function_of(wrapper)):
        places = [cell_location(cell, name) for name, cell in zip(function.__code__.co_freevars,
                                                                   function.__closure__ or ()) if _filled(cell)]
        names = function.__globals__
        places += [item_location(names, name, name) for name in function.__code__.co_names if name in names]
        for place in places:
            step = place.get()
            if _steps_of(optimizer, step):
                swapped.append((place, step))
                place.set(routed)
    return swapped or None
