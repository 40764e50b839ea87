"""graphprof's own warnings, blamed on the line of the user's code that called the traced function.

A fallback warning is about a call the user made: ``train.py:42: UserWarning: graphprof: ...`` says where,
where a fixed ``stacklevel`` said ``graphprof/tracing/traced_function.py:181``, a line of ours, and
Python's "once per location" filters then counted every traced function's warnings as one place's.
The depth between the warning and the user's call is not fixed (a warning may come from the call path,
the fallback policy, or torch.compile's callback inside the running step), so it is counted on the live
stack instead: up to the innermost traced function's entry, then past its frames to its caller.
"""

from __future__ import annotations

import os
import sys
import warnings

from graphprof.capture.sources import PACKAGE_DIR

#: The traced function's entry: the frames between the user's call and the step (capture/step_warnings.py
#: reads the same folder as graphprof's entry).
_ENTRY_DIR = os.path.join(PACKAGE_DIR, "tracing", "")
_OURS = os.path.join(PACKAGE_DIR, "")


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warn_caller``'s ``warnings.warn`` blame the user's call of the
    innermost traced function running now; without one, the first frame outside graphprof."""
    frame = sys._getframe(1)  # warn_caller, which calls warnings.warn: its level is 1
    level = 1
    entered = False
    first_outside: int | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        in_entry = filename.startswith(_ENTRY_DIR)
        if entered and not in_entry:
            return level
        entered = entered or in_entry
        if first_outside is None and not filename.startswith(_OURS):
            first_outside = level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return first_outside if first_outside is not None else 1


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` blamed on the user's call of the traced function."""
    warnings.warn(message, category, stacklevel=_caller_stacklevel())
