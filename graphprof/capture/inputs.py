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

Reachable state is found by capture/reachable.py.

The reader and effect nodes themselves, and the templates that carry graph
values into an effect, are made by capture/host_nodes.py.
"""

from __future__ import annotations

import functools
import inspect
import io
import re
import types
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Set
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch import nn

from graphprof.capture.assigned_numbers import ASSIGNED_NUMBERS
from graphprof.capture.held_values import CONTENTS_LIMIT, PLAIN_TYPES, HeldValue, Hold, Place, tensor_fields
from graphprof.capture.errors import StateNotRestored
from graphprof.capture.locations import (ABSENT, Location, attribute_location, called_function, fields_of, first_visit,
                                         item_location, object_keys, plain_object, within_location)
from graphprof.capture.indexed_arrays import indexed_view
from graphprof.capture.growing_lists import ListView, put_back, refuse_kept_views, unviewed, viewable
from graphprof.capture.kept_results import KeptPlace, note_containers
from graphprof.capture.reachable import reachable_locations
from graphprof.capture.host_nodes import (effect_node, filled, input_scalar, real_values, refusal,
                                          template_of)
from graphprof.capture.scalars import DataDependentError, TracedScalar
from graphprof.capture.sources import file_line


_Numbers = (int, float)


def _is_number(value: Any) -> bool:
    return isinstance(value, _Numbers) and not isinstance(value, bool)


# -- Python state: inputs, effects, undo --------------------------------------------
class _Extend:
    """The effect that extends a list with a replay's values (an object of graphprof's own, so that
    capture/name_reads.py knows what refers to the list)."""

    __slots__ = ("target", "template")

    def __init__(self, target: list | deque, template: Any) -> None:
        self.target, self.template = target, template

    def __call__(self, values: tuple) -> None:
        self.target.extend(filled(self.template, values))


@dataclass(slots=True)
class _Watched:
    location: Location
    before: Any
    snapshot: Any = None  # a list's or dict's contents before the step
    #: The entry whose value this is part of, read through it (``_carried_tensors``): never written itself.
    part_of: "_Watched | None" = None


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
class PythonState:
    """Reachable Python state around a capture: numbers become inputs, changes become effects."""

    watched: list[_Watched] = field(default_factory=list)
    inputs: dict[int, TracedScalar] = field(default_factory=dict)  # id(location entry) -> the input put there
    #: Keys of watched dicts whose numbers are inputs of their own (their changes are item effects).
    itemized: dict[int, set[Any]] = field(default_factory=dict)
    #: Watched entries the step assigns (a ``set`` effect): their values are its own output.
    assigned: set[int] = field(default_factory=set)
    #: Watched lists and dicts the step extends or updates (their items are its own output).
    extended: set[int] = field(default_factory=set)
    #: Watched entries, not inputs, the step assigns a plain constant (``self.calls += 1`` on a module,
    #: a mode string it switches): held by their value at the call's start (capture/assigned_numbers.py).
    pinned: set[int] = field(default_factory=set)
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
    kept_items: dict[int, dict[Any, _Watched]] = field(default_factory=dict)
    #: Watched lists of tensors the step carries whose items it replaces (``cell[0] = cell[0] * .9 + x``).
    rewritten: set[int] = field(default_factory=set)
    #: Pairs of places holding one tensor the graph reads from one of them (``kept_tensors``).
    aliases: list[tuple[Location, Location]] = field(default_factory=list)
    #: The user's functions the step can run (``reachable_locations``'s walk): their names of ``math``'s
    #: functions are wrapped as the module's are while the capture runs (capture/math_calls.py).
    functions: list[types.FunctionType] = field(default_factory=list)
    #: id(entry) -> the view put where a numpy array of the step's is kept, while the capture runs: its
    #: indexing by the step's numbers is read by each replay (capture/indexed_arrays.py).
    arrays: dict[int, Any] = field(default_factory=dict)
    #: id of a list of numbers the step keeps -> the view put where it is kept while the capture call runs:
    #: its length, items and sum are read by each replay (capture/growing_lists.py).
    views: dict[int, ListView] = field(default_factory=dict)
    #: ids of the watched entries whose place held a view (reads of them the view answered).
    viewed: set[int] = field(default_factory=set)
    #: The entries of the step's own lists and dicts (``view_lists`` views the lists of numbers among them).
    _viewable: list[_Watched] = field(default_factory=list)

    @classmethod
    def watch(cls, fn: Callable[..., Any], graph: torch.fx.Graph, record: Callable[[], Any],
              arguments: Sequence[tuple[str, Any]] = (), hooks: Sequence[Any] = ()) -> "PythonState":
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
                entry = state._add(_Watched(location, value, contents))
                state._carried_tensors(entry)
                if _is_number(value) and (user_state or location.field in ASSIGNED_NUMBERS):
                    state._make_input(entry, graph, record)
                elif user_state and entry.snapshot is not None:
                    state._watch_items(entry, graph, record, NESTED_DEPTH)
                    state._viewable.append(entry)
                else:
                    state._index_array(entry)
        except BaseException:
            state.restore()  # no input scalar may stay in the user's objects
            raise
        return state

    def _carried_tensors(self, entry: _Watched) -> None:
        """The tensors of a tuple or list of tensors the step keeps (an LSTM's ``hidden = (h, c)``,
        carried to the next call), read where they are kept: each item through the location, and its
        length held. Why: they were constants of the graph, which refused the capture, so a language
        model's step ran as segments. The step's new tuple is its ``set`` effect, as for one tensor."""
        value = entry.before
        if not _carried(value):
            return
        label = entry.location.describe
        self.watched.append(_Watched(within_location(entry.location, None, f"len({label})"), len(value), part_of=entry))
        for i, item in enumerate(value):
            self.watched.append(_Watched(within_location(entry.location, i, f"{label}[{i}]"), item, part_of=entry))
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

    def _add(self, entry: _Watched) -> _Watched:
        self.watched.append(entry)
        self.containers += entry.snapshot is not None
        return entry

    def _watch_items(self, entry: _Watched, graph: torch.fx.Graph, record: Callable[[], Any], depth: int) -> None:
        """The items of a list or dict of the step's own: a dict's numbers are inputs of their own
        (``metrics["busy_s"] += ...``), and the lists and dicts inside are watched like it
        (``metrics["losses"].append(loss.item())``), ``depth`` levels down."""
        container, label = entry.before, entry.location.describe
        items = list(container.items()) if isinstance(container, dict) else list(enumerate(container))
        for key, item in items:
            if isinstance(container, dict) and _is_number(item) and isinstance(key, (str, int)):
                sub = _Watched(item_location(container, key, f"{label}[{key!r}]"), item, None)
                self.watched.append(sub)
                self._make_input(sub, graph, record)
                self.itemized.setdefault(id(container), set()).add(key)
            elif (depth > 0 and _contents(item) is not None and len(item) <= CONTENTS_LIMIT
                  and self.containers < NESTED_LIMIT):
                inner = self._add(_Watched(item_location(container, key, f"{label}[{key!r}]"), item,
                                           self._nested_contents(item)))
                self._carried_tensors(inner)
                if inner.snapshot is not None:
                    self._watch_items(inner, graph, record, depth - 1)
                    self._viewable.append(inner)
            elif isinstance(container, dict) and (isinstance(item, torch.Tensor) and isinstance(key, (str, int))
                                                  or type(item) is tuple and _carried(item)):
                # ``S["m"] = S["m"] * .9 + x``, ``state["hidden"] = (h, c)``: read where it is kept, as
                # ``self.m`` is; a constant of the graph it was, which refused the capture.
                sub = self._add(_Watched(item_location(container, key, f"{label}[{key!r}]"), item))
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
            entry = self._add(_Watched(attribute_location(obj, name, label), value, self._nested_contents(value)))
            if _is_number(value):
                self._make_input(entry, graph, record)
            elif entry.snapshot is not None:
                self._watch_items(entry, graph, record, depth)
                self._viewable.append(entry)

    def view_lists(self, graph: torch.fx.Graph, record: Callable[[], Any]) -> None:
        """Put a view of each list of numbers the step keeps where it is kept, for the capture call's length:
        its length, items and sum are read by each replay (capture/growing_lists.py). After the state's
        contents are noted (``DeepContents``): a refused capture puts the user's lists back, never a view."""
        for entry in self._viewable:
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
        for entry in self.watched:
            view = self.views.get(id(entry.before))
            if view is None or id(entry) in self.viewed or entry.location.get() is not entry.before:
                continue
            try:
                entry.location.set(view)
            except Exception:  # a read-only place: the user's list, read there as before
                continue
            self.viewed.add(id(entry))

    def put_back_lists(self, out: Any = None, records: Set[int] = frozenset()) -> Any:
        """The user's lists where their views were, with the items the step appended to the views (once,
        when the capture call returns), and in ``out`` (the step's result, returned); refuses a list appended
        to and read in a way its view did not answer, and a view the step kept anywhere else (``records``: ids
        of graphprof's own records, which may)."""
        views, self.views = self.views, {}
        if not views:
            return out
        for entry in self.watched:
            view = views.get(id(entry.before))
            if view is not None and entry.location.get() is view:
                entry.location.set(entry.before)
        out = unviewed(out)
        for each in views.values():
            put_back(each)
        del each, view  # the loops' names: not places the step kept a view in
        refuse_kept_views(views, records)
        return out

    def _make_input(self, entry: _Watched, graph: torch.fx.Graph, record: Callable[[], Any]) -> None:
        location = entry.location
        scalar = input_scalar(graph, entry.before, location.get, location.describe, record(), location.describe)
        try:
            location.set(scalar)
        except Exception:  # a frozen dataclass, a read-only property: constant for the step
            graph.erase_node(scalar.node)
            return
        self.inputs[id(entry)] = scalar

    def _index_array(self, entry: _Watched) -> None:
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
        self.views = {}
        failed: list[_Watched] = []
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

    def effects(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any], source: Callable[[str], str],
                record: Any, history: Callable[[torch.Tensor, str], str | None] | None = None) -> None:
        """Turn every change of watched state into an effect node at the graph's end, or refuse.

        Values in the user's hands become real numbers now (the capture call's own result). ``history``
        names eager's ``grad_fn`` of a kept tensor (capture/kept_history.py). A container kept in two
        places is put in the second by reading it where the first effect put it (``placed``).
        """
        self.put_back_lists()
        placed: dict[int, KeptPlace] = {}
        made: dict[int, Any] = {}  # and one copy of its real values in both
        #: (id of a dict, key) of the items a dict's update effect puts in place (``_watch_items`` adds a
        #: watched dict's items after the dict, so the update comes first).
        updated: set[tuple[int, Any]] = set()
        for entry in self.watched:
            if entry.part_of is not None:
                continue  # read through another entry, whose change is the effect
            location, now = entry.location, entry.location.read()
            if now is ABSENT:  # ``del self.cache``, ``prune.remove``'s mask: a replay deletes nothing
                raise refusal(location.describe, "deletes", source)
            if id(entry) in self.arrays and now is self.arrays[id(entry)]:
                location.set(entry.before)  # read, not written: the user's array again
                continue
            if location.place is Place.ITEM and (id(location.owner), location.key) in updated:
                # ``out["c"] = {"c": loss.item()}`` where ``out["c"]`` held a dict: the dict's update is the
                # effect. Set again from here, it put the capture call's values back after every update.
                self.assigned.add(id(entry))
                continue
            scalar = self.inputs.get(id(entry))
            if scalar is not None and now is scalar:
                location.set(entry.before)  # read, not written
                continue
            if scalar is not None or (now is not entry.before and not _same_number(now, entry.before)):
                self.assigned.add(id(entry))
                template, slots = template_of(now, node_of, location.describe, source, history=history, placed=placed)
                note_containers(now, location.describe, location.get, placed)
                if scalar is None and not slots and type(now) in PLAIN_TYPES and type(entry.before) in PLAIN_TYPES:
                    # Computed from a constant: a replay would assign this same value on every call.
                    self.pinned.add(id(entry))
                    if _is_number(now) and _is_number(entry.before):
                        ASSIGNED_NUMBERS.add(*location.field)
                elif scalar is None and _is_number(entry.before) and _is_number(_number_of(now)):
                    # A module's number the step reads, baked, and rebinds for the next call (BYOL's
                    # ``ema.beta = tau(k)``, a Gumbel temperature): a replay would go on reading the
                    # capture call's value. Held by it, and an input from the next capture on.
                    self.pinned.add(id(entry))
                    ASSIGNED_NUMBERS.add(*location.field)
                location.set(real_values(now, made))
                effect_node(graph, f"set {location.describe}", lambda vals, loc=location, t=template:  # type: ignore[misc]  # binds by default arguments
                             loc.set(filled(t, vals)), slots, record)
                continue
            before, snapshot = entry.before, entry.snapshot
            if type(before) is deque and snapshot is not None and _changed_list(list(before), snapshot):
                added = _appended(before, snapshot)
                if added is None:
                    raise refusal(location.describe, "changes existing items of", source)
                self.extended.add(id(entry))
                template, slots = template_of(added, node_of, location.describe, source, history=history,
                                              placed=placed)
                _note_appended(added, location, placed)
                kept = list(before)[:len(before) - len(added)]
                before.clear()
                before.extend(kept + real_values(added, made))
                effect_node(graph, f"extend {location.describe}", _Extend(before, template), slots, record)
            elif (type(before) is list and snapshot is not None and id(before) in self.carried
                  and len(before) == len(snapshot) and _changed_list(before, snapshot)):
                self._set_items(entry, graph, node_of, source, record, history)
            elif type(before) is list and snapshot is not None and _changed_list(before, snapshot):
                if len(before) < len(snapshot) or any(a is not b for a, b in zip(before, snapshot)):
                    raise refusal(location.describe, "changes existing items of", source)
                self.extended.add(id(entry))
                added = before[len(snapshot):]
                template, slots = template_of(added, node_of, location.describe, source, history=history,
                                              placed=placed)
                _note_appended(added, location, placed)
                before[len(snapshot):] = real_values(added, made)
                effect_node(graph, f"extend {location.describe}", _Extend(before, template), slots, record)
            elif isinstance(before, dict) and snapshot is not None and _changed_dict(before, snapshot):
                if any(k not in before for k in snapshot):
                    raise refusal(location.describe, "removes keys from", source)
                own = self.itemized.get(id(before), set()) | self.kept_items.get(id(before), {}).keys()
                new = {k: v for k, v in before.items() if k not in own and (k not in snapshot or v is not snapshot[k])}
                if not new:
                    continue
                self.extended.add(id(entry))
                template, slots = template_of(new, node_of, location.describe, source, history=history,
                                              placed=placed)
                for key, item in new.items():
                    note_containers(item, location.describe, _item_of(before, key), placed)
                updated.update((id(before), key) for key in new)
                before.update(real_values(new, made))
                effect_node(graph, f"update {location.describe}", lambda vals, d=before, t=template:  # type: ignore[misc]  # binds by default arguments
                             d.update(filled(t, vals)), slots, record)

    def _set_items(self, entry: _Watched, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                   source: Callable[[str], str], record: Any,
                   history: Callable[[torch.Tensor, str], str | None] | None = None) -> None:
        """The items a step replaces in a list of tensors it carries (``cell[0] = cell[0] * .9 + x``):
        an effect writing the replay's values into those indices. Its items are read where they are
        kept (``_carried_tensors``), so a replay reads the ones the last call left there."""
        before, snapshot, describe = entry.before, entry.snapshot, entry.location.describe
        changed = {i: now for i, (now, was) in enumerate(zip(before, snapshot)) if now is not was}
        self.rewritten.add(id(entry))
        template, slots = template_of(changed, node_of, describe, source, history=history)
        for i, value in real_values(changed).items():
            before[i] = value
        effect_node(graph, f"set items of {describe}", lambda vals, items=before, t=template:  # type: ignore[misc]  # binds by default arguments
                     _set_items(items, filled(t, vals)), slots, record)

    def held(self, model_state: set[int], unread: Set[int] = frozenset(),
             unnamed: Callable[[str], bool] = lambda name: False) -> tuple[HeldValue, ...]:
        """What the graph was decided on, after ``effects`` (capture/held_values.py says why): every
        watched value, the type of every input number and of every value the step assigns, and the
        fields of every tensor the graph reads at run time (``model_state``: ids of parameters,
        buffers and optimizer state, held as the objects themselves). A module's field that no
        code the step ran names (``unnamed``, capture/name_reads.py) was not read: it is not held."""
        held = []
        touched = self.assigned | self.pinned | self.extended | self.inputs.keys()
        for entry in self.watched:
            where, before = entry.location, entry.before
            if entry.part_of is not None and id(entry.part_of) in self.extended:
                continue  # a log of tensors the step appends to: not carried, its items not read
            if isinstance(where.keeper, nn.Module) and id(entry) not in self.assigned:
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
            if id(entry) in self.pinned:
                hold, value = Hold.VALUE, before
            elif id(entry) in self.inputs or (id(entry) in self.assigned and not kept_tensor):
                hold, value = Hold.TYPE, type(before)
            elif kept_tensor:
                hold, value = Hold.TENSOR, tensor_fields(before)
            elif (entry.snapshot is not None and id(entry) not in self.extended | self.rewritten
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
                                  frozenset(self.itemized.get(id(before), ())) | self._replaced_keys(before)))
        held += [HeldValue(f"{a.describe} is {b.describe}", Place.WITHIN, None, None, Hold.VALUE, True,
                           functools.partial(_same_object, a.get, b.get)) for a, b in self.aliases]
        return tuple(held)

    def _unused_input(self, entry: _Watched) -> bool:
        """Whether ``entry`` is an input number the step neither assigned nor used in the graph."""
        scalar = self.inputs.get(id(entry))
        return (scalar is not None and not scalar.node.users
                and id(entry) not in self.assigned | self.pinned | self.extended)

    def _replaced_keys(self, container: Any) -> set[Any]:
        """The keys of ``container`` whose kept item the step replaces: held by their own entries (their
        type, a tensor's fields), not as the same object, which the next call finds replaced."""
        return {key for key, sub in self.kept_items.get(id(container), {}).items() if id(sub) in self.assigned}

    def reached(self) -> list[Any]:
        """The objects the watched locations hold when the step begins, and the items of the watched
        lists and dicts (a scheduler kept in ``state["sched"]``): where torch's objects are found."""
        found: list[Any] = []
        for entry in self.watched:
            found.append(entry.before)
            snapshot = entry.snapshot
            found += snapshot.values() if isinstance(snapshot, dict) else snapshot or ()
        return found

    def replaced_tensors(self) -> set[int]:
        """ids of the tensors the step replaced where they were kept (a buffer ``forward`` assigns):
        not model state the graph holds, but values read where they are kept, like ``self.ema``."""
        # Not an item of the step's dicts: one holding a parameter (``S["w"] = ...``) leaves it model state.
        items = {id(sub) for subs in self.kept_items.values() for sub in subs.values()}
        return {id(e.before) for e in self.watched if id(e) in self.assigned and isinstance(e.before, torch.Tensor)
                and id(e) not in items}

    def kept_tensors(self, model_state: set[int], read: Set[int] | None = None) -> dict[int, Location]:
        """id -> location of each tensor the step's watched state held when the call began (not
        ``model_state``): a graph constant made from one is read from its location at run time
        (``read``: the ids of the graph's constants, None for all)."""
        places: dict[int, list[_Watched]] = {}
        for entry in self.watched:
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
    def _slot(entry: _Watched) -> tuple[int, Any]:
        """Where a watched value lives, the same for one place reached by two names (``cell`` and
        ``S["cell"]``): the object holding it and its key."""
        where = entry.location
        if entry.part_of is not None:
            return id(entry.part_of.before), where.key
        return id(where.owner), where.key

    def _replaced(self, entry: _Watched) -> bool:
        """Whether the step replaces the watched value where it is kept (assigned, or an item of a
        carried tuple or list it replaces)."""
        whole = entry.part_of if entry.part_of is not None else entry
        return id(whole) in self.assigned or id(whole) in self.rewritten

    def contained_tensors(self, model_state: set[int]) -> dict[int, str]:
        """id -> where, for each tensor in a watched list or dict when the call began (not
        ``model_state``): one the graph holds as a constant cannot be replayed."""
        found: dict[int, str] = {}
        for entry in self.watched:
            items = entry.snapshot.values() if isinstance(entry.snapshot, dict) else entry.snapshot or ()
            for item in items:
                if isinstance(item, torch.Tensor) and id(item) not in model_state:
                    found.setdefault(id(item), entry.location.describe)
        return found


def _put_back(entry: _Watched) -> None:
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
        before.clear()
        before.update(snapshot)


def _same_object(a: Callable[[], Any], b: Callable[[], Any]) -> bool:
    return a() is b()


def _set_items(items: list, values: dict[int, Any]) -> None:
    for index, value in values.items():
        items[index] = value


def _note_appended(added: list, location: Location, placed: dict[int, KeptPlace]) -> None:
    """Note the containers among ``added``, the items a list or deque at ``location`` was extended by:
    each read from the end, where a replay's extension puts it."""
    for i, item in enumerate(added):
        note_containers(item, location.describe, _item_of_value(location.get, i - len(added)), placed)


def _item_of(container: Any, key: Any) -> Callable[[], Any]:
    return lambda: container[key]


def _item_of_value(read: Callable[[], Any], key: Any) -> Callable[[], Any]:
    return lambda: read()[key]


def _number_of(value: Any) -> Any:
    """The number ``value`` is, or holds as a traced number (computed from inputs or the graph)."""
    return value.value if isinstance(value, TracedScalar) else value


def _same_number(a: Any, b: Any) -> bool:
    return type(a) is type(b) and _is_number(a) and a == b


def _appended(now: deque, snapshot: list) -> list | None:
    """The items the step appended to a deque that held ``snapshot`` (a full one with ``maxlen`` drops
    as many from its left), or None: it changed it otherwise (``appendleft``, ``pop``).

    A full deque's count is the fewest appends that leave the items it kept in
    order. Why the fewest: every count leaves none kept when it fills the
    deque, so a larger count always fits; one that keeps items is told by their
    identity, and the step's new values (a replay's numbers) are new objects.
    Where a smaller count fits only because the step appended objects it held
    already (one constant), the deque's items are the same for either count.
    """
    items, limit = list(now), now.maxlen
    for added in range(1, len(items) + 1):
        kept = len(items) - added
        if len(items) != (len(snapshot) + added if limit is None else min(limit, len(snapshot) + added)):
            continue
        if all(a is b for a, b in zip(items[:kept], snapshot[len(snapshot) - kept:])):
            return items[kept:]
    return None


def _changed_list(now: list, snapshot: list) -> bool:
    return len(now) != len(snapshot) or any(a is not b for a, b in zip(now, snapshot))


def _changed_dict(now: dict, snapshot: dict) -> bool:
    return now.keys() != snapshot.keys() or any(now[k] is not snapshot[k] for k in snapshot)


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


