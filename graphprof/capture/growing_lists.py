"""A list of numbers the step appends to and reads, read by every replay where eager reads it.

Why: ``losses.append(loss.item())`` followed by ``len(losses)``, ``losses[-1]``,
``sum(losses[-10:]) / 10`` or ``sum(losses) / len(losses)`` is the
commonest logging in a training step. Python computed those from the
capture call's list, as constants, so such a step was refused (capture/
name_reads.py, ``refuse_reading_extended_lists``) and ran as segments on
every call.

How: while a capture runs, each list of plain numbers the step keeps
(``PythonState.watch``) is replaced, where it is kept, by a ``ListView``: a
list with the same items, whose reads that the step's source shows
(``NameReads.traced_uses``: a subscript, ``len``, ``sum``, a truth test)
answer with traced numbers once the step has appended to it in this call.
A list only grows between calls (a step that changes its existing items is
refused by its effect), so:

* its length is the length the call finds, read by a reader node (an
  input: a branch on ``len(losses) % 10`` is a guard, like a counter's),
  plus the number of items the step appended so far;
* an item counted from the end (``losses[-2]``) is one the step appended
  (that graph value) or the item at a fixed place from the end of the list
  the call found, read there by each replay (the list's appends are
  effects at the graph's end); one counted from the start, an item the call
  found, is read at that index;
* a tail slice (``losses[-k:]``) is a list of such items once the list
  holds ``k`` (a guard); a shorter list, or ``losses[:]``, is the whole list,
  whose length is then guarded (one graph per length);
* ``sum(losses)`` is one node that sums the list the replay finds and the
  items appended, in eager's order (the same float, bit for bit).

Before the step appends to it, the view reads as the list: a list the step
only reads (weights, milestones) is a constant of the graph, held with its
items, as before (numbers read from it in C, ``torch.tensor(weights)``,
would otherwise be traced numbers handed to code that takes only plain
ones); one it reads first and appends to after (``previous = hist[-1]``)
is refused, as before.

``len`` and ``sum`` are builtins the view cannot answer for itself
(``len`` must return an int): while the capture runs the globals of the
user's functions the step can run hold wrappers of them under those names
(as capture/math_calls.py does for ``math``'s), which answer for a view and
call the builtin for anything else. Any other read of a view (iterating,
``in``, printing the whole list, ``len`` through a function of another
module, an item the call appended read by its index from the start) is
plain, as before, and noted: a list the step also appended to is then
refused, with the same one warning as before. Reads in C that do not ask
the view (``list(losses)``, ``numpy.mean(losses)``, handing the list to a
function) are seen in the source instead: only a subscript, ``len``,
``sum`` or a truth test of the list, by its name or a local assigned it
(``hist = self.hist``), are left to the view (capture/name_reads.py).

The user's list gets the view's items back when the call returns, before
anything is compared, and the step's result gets the list where it held the
view; a view the step kept anywhere else (``self.recent = losses``) refuses
the capture, since that place would hold it after the call.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import gc
import operator
import sys
import types
from collections.abc import Set
from typing import Any, Callable, Iterable, Iterator

import torch

from graphprof.capture.host_nodes import host_function, input_scalar
from graphprof.capture.scalar_operands import recorded_call
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import is_machinery, user_source


def viewable(value: Any) -> bool:
    """A list whose items are all plain numbers (``int`` and ``float``, not ``bool``): one a view answers for."""
    return type(value) is list and all(type(item) in (int, float) for item in value)


class ListView(list):
    """The user's list during a capture: the same items, and reads answered with traced numbers."""

    def __init__(self, real: list, describe: str, graph: torch.fx.Graph, record: Callable[[], Any]) -> None:
        super().__init__(real)
        self.real, self.describe, self.graph, self.record = real, describe, graph, record
        self.found = list.__len__(real)  # the length the call found
        self._found_length: TracedScalar | None = None
        #: Where the step read the list in a way the view does not answer (None: nowhere).
        self.plain: str | None = None

    # -- what the view answers ------------------------------------------------
    def _appended(self) -> int:
        return list.__len__(self) - self.found

    def _grown(self) -> bool:
        """Whether the step appended to the list in this call: only then does the view answer (see above)."""
        return list.__len__(self) > self.found

    def found_length(self) -> TracedScalar:
        """The length the call found, read by a reader node (an input: guards may be taken on it)."""
        if self._found_length is None:
            real = self.real
            self._found_length = input_scalar(self.graph, self.found, functools.partial(list.__len__, real),
                                              f"len({self.describe})", self.record(), f"len({self.describe})")
        return self._found_length

    def length(self) -> Any:
        """``len(view)``: the length found plus the items appended so far."""
        n = self._appended()
        if n <= 0:
            return self._plain(lambda: list.__len__(self))
        return self.found_length() + n

    def total(self, start: Any = 0) -> Any:
        """``sum(view, start)``: one node summing the list a replay finds, then the items appended."""
        new = list.__getitem__(self, slice(self.found, None))
        if not self._grown() or not all(isinstance(v, (TracedScalar, int, float)) and type(v) is not bool for v in new) or not (
                isinstance(start, (TracedScalar, int, float))):
            return self._plain(lambda: builtins.sum(iter(list.__iter__(self)), start))
        operands = (start, *new)
        if not any(isinstance(v, TracedScalar) for v in operands):
            return input_scalar(self.graph, _sum_of(self.real, start, *new),
                                host_function(functools.partial(_sum_of, self.real, start, *new), "sum"),
                                f"sum({self.describe})",
                                self.record(), f"sum({self.describe})")
        return recorded_call(host_function(functools.partial(_sum_of, self.real), f"sum {self.describe}"), operands,
                             where=f"sum({self.describe})")

    def item(self, index: int) -> Any:
        """``view[index]`` for an int index: this call's own item, or one the call found, read by each replay."""
        size, n = list.__len__(self), self._appended()
        if index < 0:
            if -index <= n:
                return list.__getitem__(self, index)  # appended by this call: its own value
            if not self.length() >= -index:  # a path: the list is long enough (a guard)
                raise IndexError("list index out of range")
            return self._found_item(index + n)  # counted from the end of the list the call found
        if not self.found_length() > index:  # a path: the item is one the call found
            if index < size:  # one appended by this call, counted from the start: where depends on the length
                return self._plain(lambda: list.__getitem__(self, index))
            raise IndexError("list index out of range")
        return self._found_item(index)

    def _found_item(self, index: int) -> TracedScalar:
        value = list.__getitem__(self, index if index >= 0 else self.found + index)
        return input_scalar(self.graph, value, functools.partial(operator.getitem, self.real, index),
                            f"{self.describe}[{index}]", self.record(), f"{self.describe}[{index}]")

    def tail(self, key: slice) -> Any:
        """``view[-k:]`` (``k`` items once the list holds them) and ``view[:]``: a list of traced items."""
        start = key.start
        if key.stop is not None or key.step is not None or not (start is None or isinstance(start, (int, TracedScalar))):
            return self._plain(lambda: list.__getitem__(self, key))
        if isinstance(start, TracedScalar):
            start = operator.index(start)  # a path per index (an input: a guard on its value)
        if start is not None and start > 0:
            return self._plain(lambda: list.__getitem__(self, key))
        length = self.length()
        if start is not None and start < 0 and length >= -start:  # a path: the list holds k items
            return [self.item(i) for i in range(start, 0)]
        size = list.__len__(self)
        if isinstance(length, TracedScalar) and not length == size:  # a path per length: the whole list
            raise AssertionError("the list's length is the one just read")
        return [self.item(i) for i in range(-size, 0)]

    def _plain(self, read: Callable[[], Any]) -> Any:
        """A read the view does not answer: the real items, and the place noted."""
        if self.plain is None and not is_machinery(_reader().f_code.co_filename):
            # (graphprof's own walks of the state, capture/escaped_scalars.py, read the items: not the step)
            self.plain = user_source()
        return read()

    # -- list protocol ----------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        if not self._grown():
            return self._plain(lambda: list.__getitem__(self, key))
        if isinstance(key, slice):
            return self.tail(key)
        if type(key) is int or isinstance(key, TracedScalar):
            return self.item(operator.index(key))
        return self._plain(lambda: list.__getitem__(self, key))

    def __bool__(self) -> bool:
        return True if self._grown() else bool(self._plain(lambda: list.__len__(self)))

    def __len__(self) -> int:
        return int(self._plain(lambda: list.__len__(self)))

    def __iter__(self) -> Iterator[Any]:
        return iter(self._plain(lambda: list.__iter__(self)))

    def __reversed__(self) -> Iterator[Any]:
        return iter(self._plain(lambda: list.__reversed__(self)))

    def __contains__(self, value: Any) -> bool:
        return bool(self._plain(lambda: list.__contains__(self, value)))

    def __repr__(self) -> str:
        return str(self._plain(lambda: list.__repr__(self)))

    def __eq__(self, other: Any) -> bool:
        return bool(self._plain(lambda: list.__eq__(self, other)))

    # A copy the step makes (``copy.deepcopy(state)``, a checkpoint it pickles) is a plain list, as eager's.
    def __reduce_ex__(self, protocol: Any) -> Any:
        return self._plain(lambda: (list, (list.__getitem__(self, slice(None)),)))

    def __copy__(self) -> list:
        return list(self._plain(lambda: list.__getitem__(self, slice(None))))

    __hash__ = None  # type: ignore[assignment]  # a list's


def _reader() -> types.FrameType:
    """The frame that read the view: the innermost one not of this module."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__ and frame.f_back is not None:
        frame = frame.f_back
    return frame


def _sum_of(real: list, start: Any, *new: Any) -> Any:
    """The replay's ``sum``: the items of the list as the replay finds it, then those the step appends."""
    return builtins.sum([*real, *new], start)


def _len(obj: Any, /) -> Any:
    return obj.length() if type(obj) is ListView else builtins.len(obj)


def _sum(iterable: Any, /, start: Any = 0) -> Any:
    return iterable.total(start) if type(iterable) is ListView else builtins.sum(iterable, start)


_len.__name__, _sum.__name__ = "len", "sum"
_len.__doc__, _sum.__doc__ = builtins.len.__doc__, builtins.sum.__doc__
#: The builtins a view answers for, by name, and their wrappers.
_WRAPPERS = {"len": _len, "sum": _sum}


@contextlib.contextmanager
def traced_builtins(functions: Iterable[types.FunctionType], active: bool) -> Iterator[None]:
    """Inside (when ``active``: the capture viewed a list): the globals of ``functions`` that do not bind
    ``len`` or ``sum`` themselves hold the wrappers, which answer for a ``ListView``."""
    added: list[tuple[dict, str]] = []
    if active:
        seen: set[int] = set()
        for f in functions:
            globals_ = f.__globals__
            if id(globals_) in seen:
                continue
            seen.add(id(globals_))
            for name, wrapper in _WRAPPERS.items():
                if name not in globals_:
                    globals_[name] = wrapper
                    added.append((globals_, name))
    try:
        yield
    finally:
        for globals_, name in added:  # unless the step bound the name itself
            if globals_.get(name) is _WRAPPERS[name]:
                del globals_[name]


def put_back(view: ListView) -> None:
    """Give the user's list the view's items (those the step appended after the ones it found); refuse a
    step that appended to it and read it in a way the view did not answer."""
    items = list.__getitem__(view, slice(None))
    view.real[:] = items
    if view.plain is not None and len(items) > view.found:
        raise DataDependentError(
            f"the step reads {view.describe}, a list it also appends to, at {view.plain}: a replay would read the "
            "items and length the capture call found, not the ones eager finds")


def unviewed(value: Any) -> Any:
    """``value`` (the step's result) with each view in it, and in the lists, tuples and dicts in it, the user's
    list again (``return self.history``): lists and dicts changed in place, a tuple holding one rebuilt."""
    if type(value) is ListView:
        return value.real
    if type(value) is list or isinstance(value, dict):
        keys: Iterable[Any] = range(len(value)) if isinstance(value, list) else list(value)
        for key in keys:
            item = value[key]
            new = unviewed(item)
            if new is not item:
                value[key] = new
        return value
    if type(value) is tuple:
        items = tuple(unviewed(item) for item in value)
        return items if any(a is not b for a, b in zip(items, value)) else value
    return value


#: References a view has once the capture call is over and nothing else keeps it: the dict of views,
#: the loop's name for it, and ``sys.getrefcount``'s argument.
_OWN_REFERENCES = 3


def refuse_kept_views(views: dict[int, ListView], records: Set[int] = frozenset()) -> None:
    """Refuse a step that kept a view somewhere other than where the list is kept (``self.recent = losses``,
    ``log.append(losses)``): that place would hold graphprof's view after the capture, not the user's list.
    ``records``: ids of graphprof's own records that may hold one (a global's value before the step assigned
    it, capture/name_reads.py)."""
    for view in views.values():
        if sys.getrefcount(view) <= _OWN_REFERENCES:
            continue
        for referrer in gc.get_referrers(view):
            if (referrer is views or id(referrer) in records or isinstance(referrer, types.FrameType)
                    or _frame_locals(referrer)):
                continue
            raise DataDependentError(f"the step keeps {view.describe} in another place too (a "
                                     f"{type(referrer).__name__}), which a replayed graph would not put there")


def _frame_locals(obj: Any) -> bool:
    """A frame's ``f_locals`` snapshot (a dict only frames refer to)."""
    return type(obj) is dict and all(isinstance(r, types.FrameType) for r in gc.get_referrers(obj))
