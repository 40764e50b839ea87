"""Environment variables a step reads, held between calls; ones it sets refuse the capture.

Why: ``scale = float(os.environ.get("LOSS_SCALE", "1"))`` or ``if
os.getenv("DEBUG_GRADS"):`` in a step was decided once, in the capture
call, and every replay kept that decision after the variable changed,
silently: ``os.environ`` is a mapping of the standard library, not state the
walk of the step's names opens. Every read the step's own code makes
(``os.environ[...]``, ``.get``, ``in``, ``os.getenv``: all go through
``os._Environ.__getitem__``) is now noted with what it found, and held like
any other decided value (capture/held_values.py): a changed or removed
variable captures another graph. A step that lists the names
(``os.environ.copy()``, ``dict(os.environ)``, a loop over it) holds them
too: a variable set since is another listing. A step that sets or removes one itself
refuses: a replay would not set it again.
"""

from __future__ import annotations

import _collections_abc
import functools
import os
from typing import Any, Callable

from graphprof.capture.held_values import Hold, HeldValue, Place

#: Files a read passes through on its way from the step: ``os`` itself and ``Mapping.get``/``__contains__``
#: (their code's names: Python 3.11 runs both frozen, as ``<frozen os>``, not from their ``__file__``).
ENVIRONMENT_FILES = (os._Environ.__getitem__.__code__.co_filename, os.getenv.__code__.co_filename,
                     _collections_abc.Mapping.get.__code__.co_filename)
#: What a missing variable reads as in a held check.
_MISSING = None


class EnvironmentReads:
    """The variables the step's code read during one capture, with the value each first had."""

    def __init__(self, from_user: Callable[[tuple[str, ...]], bool]) -> None:
        #: ``from_user(skip_files)``: whether the innermost caller outside those files is the user's code.
        self.from_user = from_user
        self.read: dict[str, str | None] = {}
        #: The variables' names when the step first listed them (``os.environ.copy()``, ``dict(os.environ)``,
        #: a loop over it), or None: a variable set or unset later is another list.
        self.names: bytes | None = None

    def reading(self, original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """A stand-in for ``os._Environ.__getitem__`` that notes the step's reads of ``os.environ``."""
        reads = self

        @functools.wraps(original)
        def getitem(environ: Any, key: Any) -> Any:
            if environ is not os.environ or type(key) is not str or not reads.from_user(ENVIRONMENT_FILES):
                return original(environ, key)
            try:
                value = original(environ, key)
            except KeyError:
                reads.read.setdefault(key, _MISSING)
                raise
            reads.read.setdefault(key, value)
            return value

        return getitem

    def listing(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A stand-in for ``os._Environ.__iter__`` that notes the step's listing of ``os.environ``'s names."""
        reads = self

        @functools.wraps(original)
        def iterate(environ: Any) -> Any:
            if environ is os.environ and reads.names is None and reads.from_user(ENVIRONMENT_FILES):
                reads.names = _names()
            return original(environ)

        return iterate

    def held(self) -> tuple[HeldValue, ...]:
        """Each variable read, held at the value the capture call found (None: unset), and the names, if
        the step listed them."""
        held = [HeldValue(f"os.environ[{key!r}]", Place.WITHIN, os.environ, key, Hold.VALUE, value,
                          functools.partial(os.environ.get, key)) for key, value in self.read.items()]
        if self.names is not None:
            held.append(HeldValue("the names in os.environ", Place.WITHIN, os.environ, None, Hold.VALUE, self.names,
                                  _names))
        return tuple(held)


def _names() -> bytes:
    """``os.environ``'s names, as one value held by equality: its own encoded keys, read without its
    ``__iter__`` (which would note the listing again)."""
    return b"\0".join(sorted(os.environ._data))  # type: ignore[attr-defined]
