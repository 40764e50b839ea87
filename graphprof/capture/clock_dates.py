"""``datetime.now()``, ``utcnow()`` and ``date.today()`` in a captured step refuse the capture, naming the line.

Why: they read the clock in C, not through ``time.time``, which the capture
makes a graph input: the graph kept the capture call's datetime, and every
replay gave it again (a timestamp logged on every call repeated), with no
warning. A datetime is used as Python (formatted, subtracted, kept), which
a replay does not run, so no graph input can stand for it: the step is run
another way, with one warning. ``datetime``'s classes are C types whose
methods cannot be replaced, so while a capture runs the names the user's
functions bind to the module or to its ``datetime`` and ``date`` classes
(capture/bound_names.py) hold stand-ins: the same module and classes to the
step (``isinstance``, construction, every other attribute reach the real
ones), except that reading the time through them from the user's code
refuses the capture. What they cannot be is the class itself: ``type(d) is
datetime.datetime`` is False in the capture call (``isinstance`` is right).
"""

from __future__ import annotations

import datetime
import types
from typing import Any, Callable

#: The methods of ``datetime.datetime`` and ``datetime.date`` that read the clock.
_READS = ("now", "utcnow", "today")


class _StandInClass(type):
    """The type of a stand-in for ``datetime.datetime`` or ``datetime.date``: what it does is the real class's."""

    _real: type
    _refuse: Callable[[str], None]

    def __getattr__(cls, name: str) -> Any:
        value = getattr(cls._real, name)
        if name not in _READS:
            return value
        refuse, what = cls._refuse, f"{cls._real.__name__}.{name}"

        def read(*args: Any, **kwargs: Any) -> Any:
            refuse(what)
            return value(*args, **kwargs)
        return read

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls._real)


def date_stand_ins(refuse: Callable[[str], None]) -> dict[int, Any]:
    """id of ``datetime``, ``datetime.datetime`` and ``datetime.date`` -> its stand-in; ``refuse(what)``
    is called before each read of the clock through one (``what``: ``"datetime.now"``)."""
    classes = {real: _StandInClass(real.__name__, (), {"_real": real, "_refuse": staticmethod(refuse),
                                                        "__module__": real.__module__})
               for real in (datetime.datetime, datetime.date)}
    module = types.ModuleType(datetime.__name__, datetime.__doc__)
    vars(module).update(vars(datetime))
    vars(module).update({real.__name__: stand_in for real, stand_in in classes.items()})
    return {id(datetime): module, **{id(real): stand_in for real, stand_in in classes.items()}}

