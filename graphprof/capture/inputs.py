"""Python values a replayed step reads and writes: inputs, guards and effects.

A replayed graph does not run the step's Python. Everything Python decides
must therefore be (see DESIGN.md, section 2):

* an **input** the graph reads at run time: optimizer hyperparameters (read
  when ``Optimizer.step`` starts, as eager reads them:
  capture/hyperparameter_inputs.py), int and float
  arguments, and numbers the step keeps in its own objects (``self.micro``,
  a closure or global counter). During the capture call these are
  ``TracedScalar`` inputs whose reads are graph nodes;
* a **guard** on inputs (``if self.micro % accum == 0``), checked before a
  replay touches any state (capture/guard_check.py); a different outcome
  selects or captures another graph;
* an **effect** the graph repeats at its end: a number or attribute the step
  assigns, values it appends to a list or writes into a dict, built from the
  graph's values (``history.append(loss.item())``) or constants;
* or a reason not to replay: any other change to reachable Python state
  raises ``DataDependentError`` naming the object, and the capture is undone
  (tensors by the write log, Python state by ``PythonState.restore``).

Reachable state is found by capture/reachable.py, and watched (what each place
held, its numbers made inputs) by capture/watched_state.py; its changes become
effects in capture/state_effects.py. ``PythonState`` here brings the two
together with the views of the step's lists of numbers (``ListViews``), and
says what the graph was decided on (``held``) and which kept tensors it reads.

The reader and effect nodes themselves, and the templates that carry graph
values into an effect, are made by capture/host_nodes.py.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Set
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch import nn

from graphprof.capture.held_values import CONTENTS_LIMIT, HeldValue, Hold, Place, tensor_fields
from graphprof.capture.locations import Location, called_function
from graphprof.capture.growing_lists import (ListView, put_back as put_list_back, refuse_kept_views, unviewed,
                                             viewable)
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import file_line
from graphprof.capture.state_effects import StateEffects
from graphprof.capture.watched_state import Watched, WatchedState


@dataclass
class ListViews:
    """The views put where the step's lists of numbers are kept while the capture call runs
    (capture/growing_lists.py), and the user's lists put back in their place when it returns."""

    places: WatchedState
    #: id of a list of numbers the step keeps -> the view put where it is kept while the capture call runs:
    #: its length, items and sum are read by each replay (capture/growing_lists.py).
    views: dict[int, ListView] = field(default_factory=dict)
    #: ids of the watched entries whose place held a view (reads of them the view answered).
    viewed: set[int] = field(default_factory=set)

    def view(self, graph: torch.fx.Graph, record: Callable[[], Any]) -> None:
        """Put a view of each list of numbers the step keeps where it is kept, for the capture call's length:
        its length, items and sum are read by each replay (capture/growing_lists.py). After the state's
        contents are noted (``DeepContents``): a refused capture puts the user's lists back, never a view."""
        for entry in self.places.viewable_entries:
            value = entry.before
            if not viewable(value) or id(value) in self.views:
                continue
            view = ListView(value, entry.location.describe, graph, record)
            try:
                entry.location.set(view)
            except Exception:  # a read-only place: read as before
                continue
            self.views[id(value)] = view
            self.viewed.add(id(entry))
        self._view_elsewhere()

    def _view_elsewhere(self) -> None:
        """The same view in every other place that holds a viewed list (``hist`` and ``S["hist"]``): one
        object in both, as the user's list is."""
        for entry in self.places.watched:
            view = self.views.get(id(entry.before))
            if view is None or id(entry) in self.viewed or entry.location.get() is not entry.before:
                continue
            try:
                entry.location.set(view)
            except Exception:  # a read-only place: the user's list, read there as before
                continue
            self.viewed.add(id(entry))

    def put_back(self, out: Any = None, records: Set[int] = frozenset()) -> Any:
        """The user's lists where their views were, with the items the step appended to the views (once,
        when the capture call returns), and in ``out`` (the step's result, returned); refuses a list appended
        to and read in a way its view did not answer, and a view the step kept anywhere else (``records``: ids
        of graphprof's own records, which may)."""
        views, self.views = self.views, {}
        if not views:
            return out
        for entry in self.places.watched:
            view = views.get(id(entry.before))
            if view is not None and entry.location.get() is view:
                entry.location.set(entry.before)
        out = unviewed(out)
        for each in views.values():
            put_list_back(each)
        del each, view  # the loops' names: not places the step kept a view in
        refuse_kept_views(views, records)
        return out


@dataclass
class PythonState:
    """Reachable Python state around a capture: numbers become inputs, changes become effects."""

    #: Every place watched, with what it held when the call began (the inputs among them).
    places: WatchedState
    #: What the step changed there (filled by ``effects``).
    changes: StateEffects
    #: The views of the step's lists of numbers while the capture call runs.
    lists: ListViews
    #: Pairs of places holding one tensor the graph reads from one of them (``kept_tensors``).
    aliases: list[tuple[Location, Location]] = field(default_factory=list)

    @classmethod
    def watch(cls, fn: Callable[..., Any], graph: torch.fx.Graph, record: Callable[[], Any],
              arguments: Sequence[tuple[str, Any]] = (), hooks: Sequence[Any] = ()) -> "PythonState":
        """Watch the state ``fn`` reaches (``WatchedState.walk``), for the effects and views to come."""
        places = WatchedState.walk(fn, graph, record, arguments, hooks)
        return cls(places, StateEffects(places), ListViews(places))

    def restore(self) -> None:
        """Put every watched value back as it was before the step (``WatchedState.restore``), the views
        of its lists dropped first."""
        self.lists.views = {}
        self.places.restore()

    def effects(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any], source: Callable[[str], str],
                record: Any, history: Callable[[torch.Tensor, str], str | None] | None = None) -> None:
        """Turn every change of watched state into an effect node at the graph's end, or refuse
        (``StateEffects.effects``), with the user's lists in their places first."""
        self.lists.put_back()
        self.changes.effects(graph, node_of, source, record, history)

    def held(self, model_state: set[int], unread: Set[int] = frozenset(),
             unnamed: Callable[[str], bool] = lambda name: False) -> tuple[HeldValue, ...]:
        """What the graph was decided on, after ``effects`` (capture/held_values.py says why): every
        watched value, the type of every input number and of every value the step assigns, and the
        fields of every tensor the graph reads at run time (``model_state``: ids of parameters,
        buffers and optimizer state, held as the objects themselves). A module's field that no
        code the step ran names (``unnamed``, capture/name_reads.py) was not read: it is not held."""
        held = []
        changes = self.changes
        touched = changes.assigned | changes.pinned | changes.extended | self.places.inputs.keys()
        for entry in self.places.watched:
            where, before = entry.location, entry.before
            if entry.part_of is not None and id(entry.part_of) in self.changes.extended:
                continue  # a log of tensors the step appends to: not carried, its items not read
            if isinstance(where.keeper, nn.Module) and id(entry) not in self.changes.assigned:
                continue  # a buffer the step reads: model state (capture/reachable.py, buffer_locations)
            if (where.place is Place.ATTRIBUTE and type(where.key) is str and unnamed(where.key)
                    and (isinstance(where.owner, nn.Module) and id(entry) not in touched or self._unused_input(entry))):
                # ``in_features`` of a Linear, a trainer's ``current_flos`` that the loop around the step
                # sets to ``0`` and then adds floats to: no code that ran could read it, so neither its
                # value nor its type decided anything
                continue
            items: tuple = ()
            value: Any
            kept_tensor = isinstance(before, torch.Tensor) and id(before) not in model_state
            if id(entry) in self.changes.pinned:
                hold, value = Hold.VALUE, before
            elif id(entry) in self.places.inputs or (id(entry) in self.changes.assigned and not kept_tensor):
                hold, value = Hold.TYPE, type(before)
            elif kept_tensor:
                hold, value = Hold.TENSOR, tensor_fields(before)
            elif (entry.snapshot is not None and id(entry) not in self.changes.extended | self.changes.rewritten
                  and id(before) not in unread
                  and len(entry.snapshot) <= CONTENTS_LIMIT):  # a list or dict it only reads (``unread``: not even)
                hold, value = Hold.CONTENTS, before
                items = tuple(entry.snapshot) if type(before) in (list, deque) else tuple(entry.snapshot.items())
            elif isinstance(before, dict) and entry.snapshot is not None and entry.snapshot.keys() != before.keys():
                # A dict the step added keys to (``logs["loss"].append`` on a defaultdict): the next call
                # finds the key there, and does something else with it; its keys as at the start are held.
                hold, value, items = Hold.KEYS, before, tuple(entry.snapshot)
            else:
                hold, value = Hold.VALUE, before
            held.append(HeldValue(where.describe, where.place, where.owner, where.key, hold, value, where.get, items,
                                  frozenset(self.places.itemized.get(id(before), ())) | self._replaced_keys(before)))
        held += [HeldValue(f"{a.describe} is {b.describe}", Place.WITHIN, None, None, Hold.VALUE, True,
                           functools.partial(_same_object, a.get, b.get)) for a, b in self.aliases]
        return tuple(held)

    def _unused_input(self, entry: Watched) -> bool:
        """Whether ``entry`` is an input number the step neither assigned nor used in the graph."""
        scalar = self.places.inputs.get(id(entry))
        return (scalar is not None and not scalar.node.users
                and id(entry) not in self.changes.assigned | self.changes.pinned | self.changes.extended)

    def _replaced_keys(self, container: Any) -> set[Any]:
        """The keys of ``container`` whose kept item the step replaces: held by their own entries (their
        type, a tensor's fields), not as the same object, which the next call finds replaced."""
        return {key for key, sub in self.places.kept_items.get(id(container), {}).items()
                if id(sub) in self.changes.assigned}

    def reached(self) -> list[Any]:
        """The objects the watched locations hold when the step begins, and the items of the watched
        lists and dicts (a scheduler kept in ``state["sched"]``): where torch's objects are found."""
        found: list[Any] = []
        for entry in self.places.watched:
            found.append(entry.before)
            snapshot = entry.snapshot
            found += snapshot.values() if isinstance(snapshot, dict) else snapshot or ()
        return found

    def replaced_tensors(self) -> set[int]:
        """ids of the tensors the step replaced where they were kept (a buffer ``forward`` assigns):
        not model state the graph holds, but values read where they are kept, like ``self.ema``."""
        # Not an item of the step's dicts: one holding a parameter (``S["w"] = ...``) leaves it model state.
        items = {id(sub) for subs in self.places.kept_items.values() for sub in subs.values()}
        return {id(e.before) for e in self.places.watched
                if id(e) in self.changes.assigned and isinstance(e.before, torch.Tensor) and id(e) not in items}

    def kept_tensors(self, model_state: set[int], read: Set[int] | None = None) -> dict[int, Location]:
        """id -> location of each tensor the step's watched state held when the call began (not
        ``model_state``): a graph constant made from one is read from its location at run time
        (``read``: the ids of the graph's constants, None for all)."""
        places: dict[int, list[Watched]] = {}
        for entry in self.places.watched:
            if isinstance(entry.before, torch.Tensor) and id(entry.before) not in model_state:
                places.setdefault(id(entry.before), []).append(entry)
        self.aliases = []
        for entries in places.values():
            other = next((e for e in entries if self._slot(e) != self._slot(entries[0])), None)
            if other is not None and (read is None or id(entries[0].before) in read):
                # Read from one place: held as one object at every place, so that the user's rebinding one
                # (``h.w = new`` where ``h.w = d["w"]``) is a change, where a replay read the old one at all.
                first = self._slot(entries[0])
                self.aliases += [(entries[0].location, e.location) for e in entries if self._slot(e) != first]
            if other is not None and any(map(self._replaced, entries)) and (
                    read is None or id(entries[0].before) in read):
                # ``S = {"avg": z, "best": z}`` and ``S["avg"] = ...``: the graph holds one constant for
                # both, read from one place; after the first replay the two places hold two tensors.
                raise DataDependentError(
                    f"the step reads one tensor kept both in {entries[0].location.describe} and in "
                    f"{other.location.describe}, and replaces it in one of them: a replayed graph would "
                    "read both from one place")
        return {key: entries[-1].location for key, entries in places.items()}

    @staticmethod
    def _slot(entry: Watched) -> tuple[int, Any]:
        """Where a watched value lives, the same for one place reached by two names (``cell`` and
        ``S["cell"]``): the object holding it and its key."""
        where = entry.location
        if entry.part_of is not None:
            return id(entry.part_of.before), where.key
        return id(where.owner), where.key

    def _replaced(self, entry: Watched) -> bool:
        """Whether the step replaces the watched value where it is kept (assigned, or an item of a
        carried tuple or list it replaces)."""
        whole = entry.part_of if entry.part_of is not None else entry
        return id(whole) in self.changes.assigned or id(whole) in self.changes.rewritten

    def contained_tensors(self, model_state: set[int]) -> dict[int, str]:
        """id -> where, for each tensor in a watched list or dict when the call began (not
        ``model_state``): one the graph holds as a constant cannot be replayed."""
        found: dict[int, str] = {}
        for entry in self.places.watched:
            items = entry.snapshot.values() if isinstance(entry.snapshot, dict) else entry.snapshot or ()
            for item in items:
                if isinstance(item, torch.Tensor) and id(item) not in model_state:
                    found.setdefault(id(item), entry.location.describe)
        return found


def _same_object(a: Callable[[], Any], b: Callable[[], Any]) -> bool:
    return a() is b()


def assignment_source(fn: Callable[..., Any]) -> Callable[[str], str]:
    """`` at file:line`` of the line in ``fn``'s source that assigns to a name (best effort)."""
    function = inspect.unwrap(getattr(fn, "__func__", fn))
    call = called_function(function)  # a callable object's ``__call__`` (a partial, for a ``partialmethod``)
    call = inspect.unwrap(call.func) if isinstance(call, functools.partial) else call
    function = getattr(call, "__func__", call)
    try:
        lines, first = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or ""
    except (OSError, TypeError):
        return lambda what: ""

    def find(what: str) -> str:
        attr = re.escape(what.rsplit(".", 1)[-1])
        pattern = re.compile(rf"\b{attr}\b\s*(\[[^\]]*\]\s*)?([-+*/%]?=[^=]|\.(append|extend|update|insert|pop)\b)")
        for i, line in enumerate(lines):
            if pattern.search(line):
                return f" at {file_line(filename, first + i)}"
        return ""

    return find
