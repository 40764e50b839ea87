"""Numbers read from tensors that the step left where graphprof does not watch: refused, not left behind.

During the capture call a number the step reads from a tensor (``loss.item()``)
is a ``TracedScalar``, so that what the step computes from it is recorded.
What the step keeps in watched state (a closure's list, an object's fields,
the items of its dicts) becomes an effect that a replay repeats, and the
user's objects get real numbers back. What it keeps further away was left
as it was: a ``TracedScalar`` in the user's object, which no replay updated
(a ``collections.deque`` of recent losses, a logger two objects down), and
which raised the first time eager code compared it.

After the step's effects, ``refuse_escaped_scalars`` walks the watched
values a few levels down (lists, tuples, deques, sets, dicts and the fields
of plain objects, at most ``WALK_LIMIT`` objects) and refuses the capture
where it finds one, naming where: the step is profiled another way, with
one warning, instead of leaving a value a replay would never write.
"""

from __future__ import annotations

import collections
import functools
import types
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from graphprof.capture.locations import ABSENT, fields_of
from graphprof.capture.scalars import DataDependentError, TracedScalar

#: How many objects the walk looks at, and how deep below a watched value.
WALK_LIMIT = 20000
WALK_DEPTH = 4
#: Of a longer list or dict, the walk looks at the newest items only (appended ones are at the end).
WIDE = 1024
_SEQUENCES = (list, tuple, collections.deque, set, frozenset)
_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.Tensor, nn.Module, torch.optim.Optimizer, type)


Path = tuple[Any, ...]  # a root's label, then keys ("[k]") and field names (".name")


def _below(roots: Iterable[tuple[str, Any]]) -> Iterator[tuple[Path, Any]]:
    """(path, object) of every list, tuple, deque, set and dict below ``roots`` (a plain object's
    ``__dict__`` for the object), and every ``TracedScalar``, depth first, at most ``WALK_LIMIT`` objects and ``WALK_DEPTH`` levels
    down. Paths are built, not formatted: formatting a key calls its ``__repr__``, the user's code."""
    seen: set[int] = set()
    stack: list[tuple[Path, Any, int]] = [((label,), value, 0) for label, value in roots]
    while stack and len(seen) < WALK_LIMIT:
        path, value, depth = stack.pop()
        if type(value) is TracedScalar:
            yield path, value
            continue
        if isinstance(value, _LEAVES) or id(value) in seen or depth > WALK_DEPTH:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            yield path, value
            stack += [((*path, _Key(k)), v, depth + 1) for k, v in list(value.items())[-WIDE:]]
        elif isinstance(value, _SEQUENCES):
            yield path, value
            items = list(value)
            start = max(0, len(items) - WIDE)
            stack += [((*path, _Key(start + i)), v, depth + 1) for i, v in enumerate(items[start:])]
        elif isinstance(value, functools.partial):  # what a held callable binds: ``partial(log_to, history)``
            stack += [((*path, _Key(i)), v, depth + 1) for i, v in enumerate(value.args)]
            stack += [((*path, _Key(k)), v, depth + 1) for k, v in value.keywords.items()]
        elif isinstance(value, types.MethodType):  # ``update = tracker.update``
            stack.append(((*path, "__self__"), value.__self__, depth + 1))
        elif (fields := _user_fields(value)) is not None:
            yield path, fields
            stack += [((*path, k), v, depth + 1) for k, v in list(fields.items()) if isinstance(k, str)]


class _Key:
    """A key or index on a path (a field name is a plain str)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def describe(path: Path) -> str:
    """``state.meters['loss'].deque[1]``: keys that are numbers or strings shown, others by type."""
    text = str(path[0])
    for part in path[1:]:
        if isinstance(part, _Key):
            key = part.key
            text += f"[{key!r}]" if type(key) in (str, int, float, bool) else f"[<{type(key).__name__}>]"
        else:
            text += f".{part}"
    return text


def find_escaped(roots: Iterable[tuple[str, Any]]) -> str | None:
    """Where the first ``TracedScalar`` below ``roots`` ((label, value) pairs) is, or None."""
    return next((describe(path) for path, value in _below(roots) if type(value) is TracedScalar), None)


class _Kept:
    """One container and its contents as the step found them (an object of graphprof's own, so that
    capture/name_reads.py's referrer test knows what refers to the container)."""

    __slots__ = ("target", "before")

    def __init__(self, target: Any, before: Any) -> None:
        self.target, self.before = target, before


class DeepContents:
    """The contents of the lists, deques, sets, dicts and plain objects below the watched values
    (``watched``: ``PythonState.places.watched``),
    as the step found them: a refused capture puts them back (what is watched is put back by
    ``PythonState.restore``, after this), so that the step's run as segments finds eager's state."""

    def __init__(self, watched: Iterable[Any]) -> None:
        self._contents: list[_Kept] = []
        for _, value in _below(_roots(watched)):
            if type(value) in (list, collections.deque, set):
                self._contents.append(_Kept(value, list(value)))
            elif isinstance(value, dict):  # a plain object's fields too
                self._contents.append(_Kept(value, dict(value)))

    def restore(self) -> None:
        for kept in self._contents:
            target, before = kept.target, kept.before
            if isinstance(target, dict):
                if len(target) != len(before) or any(a is not b or target[a] is not v
                                                     for a, (b, v) in zip(target, before.items())):
                    target.clear()
                    target.update(before)
            elif len(target) != len(before) or any(a is not b for a, b in zip(target, before)):
                if type(target) is list:
                    target[:] = before
                elif type(target) is set:
                    target.clear()
                    target.update(before)
                else:
                    target.clear()
                    target.extend(before)


def _user_fields(value: Any) -> dict[str, Any] | None:
    """The plain ``__dict__`` of an object not torch's or graphprof's (None for any other)."""
    module = type(value).__module__ or ""
    return None if module.startswith(("torch", "graphprof", "builtins")) else fields_of(value)


def _roots(watched: Iterable[Any]) -> Iterator[tuple[str, Any]]:
    """(label, value now) of each watched entry (``PythonState.places.watched``)."""
    return ((entry.location.describe, value) for entry in watched if (value := entry.location.read()) is not ABSENT)


def refuse_escaped_scalars(watched: Iterable[Any]) -> None:
    """Refuse the capture where a value the step read from a tensor is still in the user's objects,
    below a watched value (``watched``: ``PythonState.places.watched`` after its effects)."""
    where = find_escaped(_roots(watched))
    if where is not None:
        raise DataDependentError(
            f"the step keeps a number read from a tensor in {where}, which graphprof does not watch: a "
            "replay would not write it there")
