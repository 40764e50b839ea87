"""The step's reachable Python state, watched: what each place held when the capture call began.

Why a module of its own: capture/inputs.py decides what a replay reads, repeats
or refuses, and it needs one record of the state the step reaches, made before
the step runs: every place (``Watched``) with the value it held and, for a list
or dict, its contents. Numbers found there are replaced by graph inputs while
the capture call runs (``TracedScalar``), and numpy arrays by indexed views; the
same record is what puts everything back when a capture is refused or fails
(``WatchedState.restore``), and the numbers back around a scheduler's step
(``real_numbers``). What the step changed is worked out from it by
capture/state_effects.py.
"""

from __future__ import annotations

import io
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx

from graphprof.capture.assigned_numbers import ASSIGNED_NUMBERS
from graphprof.capture.held_values import CONTENTS_LIMIT, Place
from graphprof.capture.errors import StateNotRestored
from graphprof.capture.locations import (Location, attribute_location, fields_of, first_visit, item_location,
                                         keeps_items_elsewhere, object_keys, own_method, plain_object,
                                         within_location)
from graphprof.capture.indexed_arrays import indexed_view
from graphprof.capture.reachable import reachable_locations
from graphprof.capture.host_nodes import input_scalar
from graphprof.capture.scalars import DataDependentError, TracedScalar


_Numbers = (int, float)


def is_number(value: Any) -> bool:
    return isinstance(value, _Numbers) and not isinstance(value, bool)


@dataclass(slots=True)
class Watched:
    """One place of the step's state and what it held when the call began: what a refused capture puts
    back there, and what the step's change of it is told from."""

    location: Location
    before: Any
    snapshot: Any = None  # a list's or dict's contents before the step
    #: The entry whose value this is part of, read through it (``_carried_tensors``): never written itself.
    part_of: "Watched | None" = None


#: The most tensors of a tuple or list the step carries between calls that are read where they are kept.
CARRIED_LIMIT = 16


def _carried(value: Any) -> bool:
    """A tuple or list of tensors, as a step carries an RNN's state between calls."""
    return type(value) in (tuple, list) and 0 < len(value) <= CARRIED_LIMIT and all(
        isinstance(item, torch.Tensor) for item in value)


def _contents(value: Any) -> Any:
    if type(value) is list or type(value) is deque:  # a deque of recent losses (torchvision's SmoothedValue)
        return list(value)
    if isinstance(value, dict):  # a defaultdict or OrderedDict of logged values too
        return dict(value)
    return None


#: How deep into the lists and dicts of the step's own state their lists and dicts are watched
#: (``metrics["losses"].append(...)``, ``stats["n"]["steps"] += 1``), and how many in all.
NESTED_DEPTH = 2
NESTED_LIMIT = 256


@dataclass
class WatchedState:
    """Every place of reachable Python state the step may read or write, with what it held when the call
    began; numbers among them are inputs of the graph while the capture call runs."""

    watched: list[Watched] = field(default_factory=list)
    inputs: dict[int, TracedScalar] = field(default_factory=dict)  # id(location entry) -> the input put there
    #: Keys of watched dicts whose numbers are inputs of their own (their changes are item effects).
    itemized: dict[int, set[Any]] = field(default_factory=dict)
    #: How many watched entries are lists or dicts (``_watch_items`` stops at ``NESTED_LIMIT``).
    containers: int = 0
    #: ``object_keys`` of the objects whose fields are watched (each once, wherever the step reaches
    #: it, and instances sharing one ``__dict__`` once).
    objects: set[int] = field(default_factory=set)
    #: ids of the lists, deques and dicts whose items one entry watches (``_nested_contents``).
    contained: set[int] = field(default_factory=set)
    #: ids of the tuples and lists of tensors whose items are read where they are kept (``_carried_tensors``).
    carried: set[int] = field(default_factory=set)
    #: Per watched dict (by id): the keys whose tensor, or tuple of tensors, is watched as an entry of its
    #: own (``S["m"]``, ``S["hidden"] = (h, c)``): read where it is kept, its replacement that entry's
    #: ``set`` effect, not an item of the dict's update (``_watch_items``).
    kept_items: dict[int, dict[Any, Watched]] = field(default_factory=dict)
    #: The user's functions the step can run (``reachable_locations``'s walk): their names of ``math``'s
    #: functions are wrapped as the module's are while the capture runs (capture/math_calls.py).
    functions: list[types.FunctionType] = field(default_factory=list)
    #: id(entry) -> the view put where a numpy array of the step's is kept, while the capture runs: its
    #: indexing by the step's numbers is read by each replay (capture/indexed_arrays.py).
    arrays: dict[int, Any] = field(default_factory=dict)
    #: The entries of the step's own lists and dicts (capture/inputs.py's ``ListViews`` views the lists of
    #: numbers among them).
    viewable_entries: list[Watched] = field(default_factory=list)

    @classmethod
    def walk(cls, fn: Callable[..., Any], graph: torch.fx.Graph, record: Callable[[], Any],
             arguments: Sequence[tuple[str, Any]] = (), hooks: Sequence[Any] = ()) -> "WatchedState":
        """Watch the state ``fn`` reaches (capture/reachable.py), its numbers made inputs of ``graph``;
        everything is put back if the walk fails part way."""
        state = cls()
        reachable = list(reachable_locations(fn, arguments, hooks, state.functions))
        state.objects = {key for loc, _, _ in reachable if loc.place is Place.ATTRIBUTE
                         for key in object_keys(loc.owner)}
        for location, value, _ in reachable:  # before anything is replaced by an input: nothing to undo
            if isinstance(value, io.IOBase) and not value.closed:
                raise DataDependentError(f"the step holds the open file {location.describe}, which a replayed "
                                         "graph would not write or read again")
        # Those the step's own names hold are watched there, the deepest: not again where they are nested.
        state.contained = {id(value) for _, value, user_state in reachable if user_state and _contents(value) is not None}
        named: set[int] = set()  # the lists, deques and dicts whose contents a name's entry watches
        try:
            for location, value, user_state in reachable:
                contents = _contents(value)
                if contents is not None and id(value) in named:
                    # One list reached by two names (``hist`` and ``trainer.hist``): its changes are
                    # one effect, of the first; two extended it twice per replay. The name is held.
                    contents = None
                elif contents is not None:
                    named.add(id(value))
                entry = state._add(Watched(location, value, contents))
                state._carried_tensors(entry)
                if is_number(value) and (user_state or location.field in ASSIGNED_NUMBERS):
                    state._make_input(entry, graph, record)
                elif user_state and entry.snapshot is not None:
                    state._watch_items(entry, graph, record, NESTED_DEPTH)
                    state.viewable_entries.append(entry)
                else:
                    state._index_array(entry)
        except BaseException:
            state.restore()  # no input scalar may stay in the user's objects
            raise
        return state

    def _carried_tensors(self, entry: Watched) -> None:
        """The tensors of a tuple or list of tensors the step keeps (an LSTM's ``hidden = (h, c)``,
        carried to the next call), read where they are kept: each item through the location, and its
        length held. Why: they were constants of the graph, which refused the capture, so a language
        model's step ran as segments. The step's new tuple is its ``set`` effect, as for one tensor."""
        value = entry.before
        if not _carried(value):
            return
        label = entry.location.describe
        self.watched.append(Watched(within_location(entry.location, None, f"len({label})"), len(value), part_of=entry))
        for i, item in enumerate(value):
            self.watched.append(Watched(within_location(entry.location, i, f"{label}[{i}]"), item, part_of=entry))
        self.carried.add(id(value))

    def _nested_contents(self, value: Any) -> Any:
        """The contents of a list, deque or dict inside the step's state, to watch with its entry (None for
        another value, or one watched elsewhere).

        A closure's ``summ`` that is also ``S["summ"]`` (knowledge-distillation's
        ``train_kd``) is watched once, where the step names it: its numbers are
        one input each, and its changes one effect. Watched twice, each number
        was replaced by a second input over the first, and a refused capture put
        the first back in the user's dicts. The other place holds the same object.
        """
        contents = _contents(value)
        if contents is None or id(value) in self.contained:
            return None
        self.contained.add(id(value))
        return contents

    def _add(self, entry: Watched) -> Watched:
        if isinstance(entry.before, dict) and entry.snapshot is not None and keeps_items_elsewhere(entry.before):
            # Its items put back by graphprof's own writes (``own_method``), the copy stays the step's:
            # refused before anything is written there, and before the step runs.
            raise DataDependentError(
                f"the step keeps {entry.location.describe}, a {type(entry.before).__name__} whose own __setitem__ "
                "keeps its items elsewhere too, which graphprof would not put back or replay there")
        self.watched.append(entry)
        self.containers += entry.snapshot is not None
        return entry

    def _watch_items(self, entry: Watched, graph: torch.fx.Graph, record: Callable[[], Any], depth: int) -> None:
        """The items of a list or dict of the step's own: a dict's numbers are inputs of their own
        (``metrics["busy_s"] += ...``), and the lists and dicts inside are watched like it
        (``metrics["losses"].append(loss.item())``), ``depth`` levels down."""
        container, label = entry.before, entry.location.describe
        items = list(container.items()) if isinstance(container, dict) else list(enumerate(container))
        for key, item in items:
            if isinstance(container, dict) and is_number(item) and isinstance(key, (str, int)):
                sub = Watched(item_location(container, key, f"{label}[{key!r}]"), item, None)
                self.watched.append(sub)
                self._make_input(sub, graph, record)
                self.itemized.setdefault(id(container), set()).add(key)
            elif (depth > 0 and _contents(item) is not None and len(item) <= CONTENTS_LIMIT
                  and self.containers < NESTED_LIMIT):
                inner = self._add(Watched(item_location(container, key, f"{label}[{key!r}]"), item,
                                          self._nested_contents(item)))
                self._carried_tensors(inner)
                if inner.snapshot is not None:
                    self._watch_items(inner, graph, record, depth - 1)
                    self.viewable_entries.append(inner)
            elif isinstance(container, dict) and (isinstance(item, torch.Tensor) and isinstance(key, (str, int))
                                                  or type(item) is tuple and _carried(item)):
                # ``S["m"] = S["m"] * .9 + x``, ``state["hidden"] = (h, c)``: read where it is kept, as
                # ``self.m`` is; a constant of the graph it was, which refused the capture.
                sub = self._add(Watched(item_location(container, key, f"{label}[{key!r}]"), item))
                self._carried_tensors(sub)
                self.kept_items.setdefault(id(container), {})[key] = sub
            elif (depth > 0 and plain_object(item) and self.containers < NESTED_LIMIT
                  and first_visit(item, self.objects)):
                self._watch_fields(item, f"{label}[{key!r}]", graph, record, depth - 1)

    def _watch_fields(self, obj: Any, label: str, graph: torch.fx.Graph, record: Callable[[], Any], depth: int) -> None:
        """The fields of an object in a list or dict of the step's own (``meters["loss"].update(v)`` on an
        ``AverageMeter``), watched as those of an object the step names: numbers are inputs, lists
        and dicts are watched ``depth`` levels further down."""
        self.containers += 1
        for name, value in list((fields_of(obj) or {}).items()):
            if not isinstance(name, str):
                continue
            entry = self._add(Watched(attribute_location(obj, name, label), value, self._nested_contents(value)))
            if is_number(value):
                self._make_input(entry, graph, record)
            elif entry.snapshot is not None:
                self._watch_items(entry, graph, record, depth)
                self.viewable_entries.append(entry)

    def _make_input(self, entry: Watched, graph: torch.fx.Graph, record: Callable[[], Any]) -> None:
        location = entry.location
        scalar = input_scalar(graph, entry.before, location.get, location.describe, record(), location.describe)
        try:
            location.set(scalar)
        except Exception:  # a frozen dataclass, a read-only property: constant for the step
            graph.erase_node(scalar.node)
            return
        self.inputs[id(entry)] = scalar

    def _index_array(self, entry: Watched) -> None:
        """Put a view of a numpy array the step keeps where it is kept, for the capture's length: its items
        read at the step's numbers are read by each replay (capture/indexed_arrays.py)."""
        view = indexed_view(entry.before, entry.location.describe, entry.location.get)
        if view is None:
            return
        try:
            entry.location.set(view)
        except Exception:  # a read-only place: indexed as before
            return
        self.arrays[id(entry)] = view

    def real_numbers(self, real: bool) -> None:
        """Put the numbers back where inputs still hold their scalars (``real``), or the scalars back
        where those numbers still are.

        A scheduler's step runs on real numbers (capture/host_calls.py): a
        ``LambdaLR`` whose lambda reads ``self.warmup`` computed a traced rate,
        which stayed in the scheduler and the optimizer's groups, in the user's
        hands. Its replay reads the same locations when it runs, as eager does.
        """
        for entry in self.watched:
            scalar = self.inputs.get(id(entry))
            if scalar is None:
                continue
            now = entry.location.read()
            if real and now is scalar:
                entry.location.set(entry.before)
            elif not real and now is entry.before:
                entry.location.set(scalar)

    def restore(self) -> None:
        """Put every watched value back as it was before the step (a failed or refused capture), the
        last watched first: an entry's ``before`` is what the entries watched earlier left there.

        A place the step deleted (``del S["x"]``, ``prune.remove``'s buffer) is made again, as eager's
        run from here needs it. Never stops half way: stopped at one entry, the entries after it kept
        the step's values, and graphprof's traced numbers, which every later call of the user's code
        raised on. An entry that cannot be put back is tried again after all the others (an item of a
        list the step shortened is there again once the list is put back), and one that still cannot
        is named by ``StateNotRestored``, raised when everything else is back.
        """
        failed: list[Watched] = []
        for entry in reversed(self.watched):
            if entry.part_of is not None:
                continue  # put back with the value it is part of
            try:
                _put_back(entry)
            except Exception:
                failed.append(entry)
        failures: list[tuple[str, BaseException]] = []
        for entry in failed:
            try:
                _put_back(entry)
            except Exception as exc:
                failures.append((entry.location.describe, exc))
        if failures:
            raise StateNotRestored(failures)


def _put_back(entry: Watched) -> None:
    """Put ``entry``'s value back where it was found, and a list's or dict's contents as they were."""
    before, snapshot = entry.before, entry.snapshot
    if entry.location.read() is not before:
        entry.location.set(before)
    if type(before) is list and snapshot is not None:
        before[:] = snapshot
    elif type(before) is deque and snapshot is not None:
        before.clear()
        before.extend(snapshot)
    elif isinstance(before, dict) and snapshot is not None:
        own_method(before, "clear")()
        write_items(before, snapshot, own_method(before, "__setitem__"))


def write_items(container: dict, items: dict, put: Callable[[Any, Any], None] | None = None) -> None:
    """Write ``items`` into ``container`` one key at a time, as ``container[key] = value`` does.

    Why not ``container.update(items)``: a ``collections.Counter``'s ``update``
    adds counts where a dict's replaces them, so a key the step made on the
    capture call was counted twice, and every replay's count stayed one too
    high. Why not ``dict.update(container, items)``: on an ``OrderedDict`` it
    bypasses the order the class keeps, and the new keys vanished from its
    iteration. Item assignment replaces on every dict and keeps a key where it
    is, a new one appended, as the step's own ``d[key] = value`` does. ``put``:
    graphprof's own write (``own_method``), where not the step's write replayed.
    """
    put = put or container.__setitem__
    for key, value in items.items():
        put(key, value)
