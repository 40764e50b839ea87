"""NumPy arrays the step indexes by one of its numbers: the item read by every replay, where eager reads it.

Why: DINO, iBOT, BEiT and ConvNeXt compute their schedules once, as numpy
arrays (``lr_schedule = cosine_scheduler(...)``), and each step sets
``g["lr"] = lr_schedule[it]`` with ``it`` a counter the step keeps. numpy
asks the index for ``__index__``, which took a guard on the counter's value
(capture/scalars.py), and the item was a constant of the graph: one capture
per call, and after five the step ran as segments, with one warning.

How: while a capture runs, each one-dimensional ``float64`` array the step
reaches by name (a closure cell, a global, an attribute of its objects or
modules: ``PythonState.watch``) is replaced, where it is kept, by a view of
it whose indexing by one of the step's integers is a reader node of the
graph: each replay reads ``array[index]`` from where the user keeps the
array, with that replay's index, at the place in the step where eager reads it.
Any other indexing of the view is the array's own (its items, its slices,
eager's errors). The array is put back when the capture ends.

Why read at run time rather than held unchanged: the array is the user's
object, and nothing stops the user from changing it between calls
(``lr_schedule[:] = new`` on a restart). A replay that reads it where eager
reads it gives eager's number whether or not it changed, with no check on
every call; one rebound to another array (``self.lr_schedule = ...``) is a
held value that changed (held as the same object, capture/held_values.py),
and captures again. The index's range is a path, guarded like a branch
(``-len(array) <= index < len(array)``): a call past the end captures again,
and eager's ``IndexError`` comes from that capture. A step that writes into
the array refuses: a replay would not write again.

Only ``float64`` (numpy's schedules; its items are ``numpy.float64``, a
subclass of ``float``, which every path of graphprof takes as a number) and
one dimension (one index, one number): others are indexed as before.
numpy's functions of the view give plain arrays (``view * 2``); an array a
method of the view makes (``view.copy()``) is of its class but indexed,
printed and pickled as a plain array.
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any, Callable

from graphprof.capture.host_nodes import host_function, mark_reader
from graphprof.capture.scalar_operands import recorded_call
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import user_source


def indexed_view(value: Any, name: str, read: Callable[[], Any]) -> Any | None:
    """A view of ``value`` whose indexing by a traced integer is a node reading the array where it is
    kept (``read``, labelled ``name``), or None when ``value`` is not a one-dimensional ``float64`` array."""
    numpy = sys.modules.get("numpy")
    if numpy is None or type(value) is not numpy.ndarray or value.ndim != 1 or value.dtype != numpy.float64:
        return None
    view = value.view(_view_type())
    view._graphprof_array = value
    view._graphprof_place = (name, read)
    return view


def _traced_item(array: Any, index: TracedScalar, place: tuple[str, Callable[[], Any]]) -> Any:
    """``array[index]`` as a reader node of the graph, its range guarded; the array's own indexing
    (a guard on the index's value, or eager's error) where the index is not one a check can read."""
    value = index.value
    size = len(array)
    if type(value) is not int or not (index.is_input or index.counted) or not -size <= value < size:
        return array[index]
    if not (index >= -size and index < size):  # the guards of the path; true here
        return array[index]
    name, read = place
    reader = host_function(functools.partial(_item, read), f"read {name}[]")
    result = recorded_call(reader, (index,), where=f"{name}[{index.node.name}]")
    mark_reader(result.node)
    return result


def _item(read: Callable[[], Any], index: int) -> Any:
    """The reader's function: the item of the array where it is kept, as eager reads it (a
    ``numpy.float64``; during the capture call, through the view)."""
    return read()[index]


@functools.cache
def _view_type() -> type:
    """The view's class, made once numpy is there (graphprof does not import numpy itself)."""
    import numpy

    class IndexedArray(numpy.ndarray):  # type: ignore[misc, type-arg]
        """A view of the user's array during a capture: indexing by a traced integer is a reader node."""

        #: The user's array (None in an array numpy derives from the view: a plain array's indexing).
        _graphprof_array: Any = None
        #: Where the user keeps it: its label, and how a replay reads it there.
        _graphprof_place: tuple[str, Callable[[], Any]] = ("", lambda: None)

        def __getitem__(self, key: Any) -> Any:
            array = self._graphprof_array
            if array is None:
                return super().__getitem__(key)
            if isinstance(key, TracedScalar):
                return _traced_item(array, key, self._graphprof_place)
            return array[key]

        def __setitem__(self, key: Any, value: Any) -> None:
            if self._graphprof_array is None:
                super().__setitem__(key, value)
                return
            raise DataDependentError(f"the step writes into the numpy array {self._graphprof_place[0]} at "
                                     f"{user_source(2)}, which a replayed graph would not write again")

        # A copy the step makes (``copy.deepcopy`` of a module keeping the array) is the user's array's.
        def __copy__(self) -> Any:
            return super().__copy__() if self._graphprof_array is None else copy.copy(self._graphprof_array)

        def __deepcopy__(self, memo: dict[int, Any] | None = None, /) -> Any:
            array = self._graphprof_array
            return super().__deepcopy__(memo) if array is None else copy.deepcopy(array, memo)

        def __reduce__(self) -> Any:
            array = self._graphprof_array
            # An array derived from the view pickles as the plain array it is to the user: this class
            # is local, and pickle cannot name it (a checkpoint holding it would not save).
            return (self.view(numpy.ndarray) if array is None else array).__reduce__()

        # Printed as the plain array it stands for: numpy's repr names an array's class.
        def __repr__(self) -> str:
            return repr(self.view(numpy.ndarray))

        # numpy's functions of the view (``view * 2``, ``numpy.exp(view)``) give plain arrays, as eager's.
        def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
            plain = array.view(numpy.ndarray)
            return plain[()] if return_scalar else plain

    return IndexedArray
