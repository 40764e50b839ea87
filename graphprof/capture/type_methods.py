"""Replacing methods of a type written in C (``torch.Generator``) for the length of a capture.

Why: ``g.manual_seed(7)``, ``g.get_state()`` and ``g.set_state(st)`` on a
``torch.Generator`` run no aten op, so a captured graph had no trace of
them and replays kept drawing from one stream (capture/rng_calls.py records
them instead). ``torch._C.Generator`` is an immutable C type: ``setattr`` on
it is refused, and its instances have no ``__dict__``. The dict behind the
type's read-only ``__dict__`` view can still be written; ``PyType_Modified``
then drops CPython's cached lookups of the type, so the next ``g.manual_seed``
finds the replacement. Everything is put back, and the caches dropped again,
when the capture ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from typing import Any, Callable, Iterator


def _namespace(owner: type) -> dict[str, Any]:
    """The dict behind ``owner.__dict__`` (a read-only mappingproxy of it)."""
    referents = [r for r in gc.get_referents(owner.__dict__) if isinstance(r, dict)]
    if len(referents) != 1:
        raise RuntimeError(f"cannot reach the methods of {owner.__name__}")
    return referents[0]


def _modified(owner: type) -> None:
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(owner))


@contextlib.contextmanager
def patched_methods(owner: type, wrappers: dict[str, Callable[[Any], Callable[..., Any]]]) -> Iterator[None]:
    """Inside: each method ``name`` of ``owner`` is ``wrappers[name](original)`` (a plain function, so an
    instance's lookup binds it as the original was bound)."""
    namespace = _namespace(owner)
    originals = {name: namespace[name] for name in wrappers if name in namespace}
    try:
        for name, original in originals.items():
            namespace[name] = wrappers[name](original)
        _modified(owner)
        yield
    finally:
        namespace.update(originals)
        _modified(owner)
