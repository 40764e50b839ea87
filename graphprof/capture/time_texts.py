"""The time as text (``time.ctime()``, ``time.strftime("%H:%M")``) in a line the step only prints.

Why: fast_neural_style logs ``mesg = "{}\\tEpoch {}: loss
{:.6f}".format(time.ctime(), e, l); print(mesg)``. ``time.ctime()`` reads
the clock in C, not through ``time.time``, which the capture makes a graph
input: its text was a constant of the capture call, and every replay
printed the capture call's time. While a step is captured these functions,
called by the user's code with no time of their own, read the clock as an
input of the graph (``time.time``) and give a marker, as a formatted number
does (capture/printed_texts.py), when their text only reaches ``print`` or a
logger: the replay's print node writes the time it read. Their text used
any other way refuses the capture, naming the line.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from graphprof.capture.printed_texts import PrintedTexts
from graphprof.capture.scalars import DataDependentError, TracedScalar

#: The functions, and how many arguments a call gives when it asks for the current time.
TIME_TEXTS = {"ctime": 0, "asctime": 0, "strftime": 1}
_localtime = time.localtime


def _ctime_text(original: Callable[..., str], seconds: float) -> str:
    return original(seconds)


def _local_time_text(original: Callable[..., str], seconds: float, *spec: str) -> str:
    return original(*spec, _localtime(seconds))


def _formatter(name: str, original: Callable[..., str]) -> Callable[..., str]:
    """The text ``original`` gives for the time ``seconds`` (and a ``strftime`` format): module functions,
    as the other formatted values' are, so the output node's template holds no closure."""
    return functools.partial(_ctime_text if name == "ctime" else _local_time_text, original)


def time_text(name: str, original: Callable[..., str], texts: PrintedTexts, from_user: Callable[[], bool],
              clock: Callable[[], TracedScalar], where: Callable[[], str]) -> Callable[..., str]:
    """``original`` (``time.<name>``), as the capture gives it to the user's code: ``clock()`` reads the
    time as an input of the graph, ``where`` names the calling line."""
    def text(*args: Any) -> str:
        if len(args) != TIME_TEXTS[name] or not from_user():
            return original(*args)
        line = where()
        seconds = clock()
        marker = texts.defer(seconds, _formatter(name, original), tuple(args), f"{line} (time.{name})")
        if marker is None:
            raise DataDependentError(f"the step reads the time as text (time.{name}) at {line} and uses it other "
                                     "than in a line it only prints or logs, which a replayed graph would keep as "
                                     "the capture call's text")
        return marker
    text.__name__ = text.__qualname__ = name
    text.__doc__ = original.__doc__
    return text
