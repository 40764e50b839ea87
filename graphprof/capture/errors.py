"""The errors capture raises, with a message a user can act on: ``CaptureError`` when the step could not be
captured (its state put back, so that it runs another way), ``StateNotRestored`` when not even that was
possible."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import file_line, is_library


class CaptureError(RuntimeError):
    """The function could not be captured as a static graph; its state was restored."""

    #: The path the step refused on, when a refusal of its Python named one (capture/refused_paths.py).
    refused_path: Any = None

    @classmethod
    def from_exception(cls, function: str, exc: BaseException) -> "CaptureError":
        path = None
        if isinstance(exc, DataDependentError):
            reason = str(exc)
            path = exc.refused_path
        else:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            reason = f"{type(exc).__name__}: {first_line}"
            if "TracedScalar" in first_line:
                reason = _run_time_number(exc, first_line)
            elif "dynamo-optimized function" in first_line:
                reason = (f"the step calls code compiled with torch.compile{_user_line(exc)}, which only "
                          "torch.compile itself can trace")
            elif isinstance(exc, NotImplementedError) and _passed_through(exc, copy.__file__):
                reason = (f"the step deep-copies tensors{_user_line(exc)} (copy.deepcopy of a state dict, a "
                          f"module or an object holding tensors), which a static graph cannot copy anew ({reason})")
        error = cls(f"cannot capture {function} as one static graph: {reason} "
                    "(parameters and optimizer state were restored to before the call)")
        error.refused_path = path
        return error


class StateNotRestored(RuntimeError):
    """A capture that did not keep its graph could not put back part of what the step changed.

    Why an error of its own, raised to the caller: after any other refused or
    failed capture the step runs again (eagerly, or as segments) from the state
    the capture put back, and gives eager's outcome. From a state not put back
    that run would not be eager's, silently. What could be put back was put
    back first, so that none of graphprof's traced numbers is left in the
    user's objects; the error names the places that could not be.
    """

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        self.failures = tuple(failures)
        named = "; ".join(f"{where} ({type(exc).__name__}: {_first_line(exc)})" for where, exc in self.failures[:3])
        more = f"; and {len(self.failures) - 3} more" if len(self.failures) > 3 else ""
        super().__init__(f"graphprof: the step was not captured, and what it changed could not all be put back: "
                         f"{named}{more}. Everything else was put back, but the state is not the one the call "
                         "began with, so the step is not run again for this call")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _run_time_number(exc: BaseException, first_line: str) -> str:
    """The reason when code that takes only a plain number was given one graphprof reads at run time.

    Why: the step's number arguments and the numbers in its state are
    ``TracedScalar``s while the capture call runs, so that each replay reads
    them anew; a C function that wants a real int (``Generator.manual_seed(i)``)
    refuses one with a message naming graphprof's own type. Said in the
    user's terms, at the user's line.
    """
    said = first_line.replace("<class 'graphprof.capture.scalars.TracedScalar'>", "a number read at run time")
    said = said.replace("TracedScalar", "a number read at run time")
    return (f"a number the step reads anew on every call (a number argument, or a number kept in its state) is "
            f"passed{_user_line(exc)} to code that takes only a plain number ({type(exc).__name__}: {said})")


def _passed_through(exc: BaseException, filename: str) -> bool:
    """Whether the exception passed through code of ``filename`` (``copy.py``: a deep copy raised)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            return True
        tb = tb.tb_next
    return False


def _user_line(exc: BaseException) -> str:
    """`` at file:line`` of the innermost frame of the user's code the exception passed through, or ""."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_library(code.co_filename):
            where = f" at {file_line(code.co_filename, tb.tb_lineno)}"
        tb = tb.tb_next
    return where
