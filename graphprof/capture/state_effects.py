"""What the step changed in its watched Python state, turned into effects a replay repeats.

Why a module of its own: after the capture call returns, every place
capture/watched_state.py watched is compared with what it held before. A number
or attribute the step assigns becomes a ``set`` effect at the graph's end, a
list or deque it appends to an ``extend`` effect, a dict it adds to an
``update`` effect, built from the graph's values or constants (capture/host_nodes.py
makes the nodes); any other change (a deleted place, a changed item) refuses the
capture. What it finds (``assigned``, ``extended``, ``pinned``, ``rewritten``) is
what capture/inputs.py then holds, and what capture/name_reads.py checks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from graphprof.capture.assigned_numbers import ASSIGNED_NUMBERS
from graphprof.capture.held_values import PLAIN_TYPES, Place
from graphprof.capture.locations import ABSENT, Location, own_method
from graphprof.capture.kept_results import KeptPlace, note_containers
from graphprof.capture.host_nodes import effect_node, filled, real_values, refusal, template_of
from graphprof.capture.scalars import TracedScalar
from graphprof.capture.watched_state import Watched, WatchedState, is_number, write_items


class _Extend:
    """The effect that extends a list with a replay's values (an object of graphprof's own, so that
    capture/name_reads.py knows what refers to the list)."""

    __slots__ = ("target", "template")

    def __init__(self, target: list | deque, template: Any) -> None:
        self.target, self.template = target, template

    def __call__(self, values: tuple) -> None:
        self.target.extend(filled(self.template, values))


@dataclass
class StateEffects:
    """The changes of ``watch``'s places the capture call made, each an effect node, or a refusal."""

    watch: WatchedState
    #: Watched entries the step assigns (a ``set`` effect): their values are its own output.
    assigned: set[int] = field(default_factory=set)
    #: Watched lists and dicts the step extends or updates (their items are its own output).
    extended: set[int] = field(default_factory=set)
    #: Watched entries, not inputs, the step assigns a plain constant (``self.calls += 1`` on a module,
    #: a mode string it switches): held by their value at the call's start (capture/assigned_numbers.py).
    pinned: set[int] = field(default_factory=set)
    #: Watched lists of tensors the step carries whose items it replaces (``cell[0] = cell[0] * .9 + x``).
    rewritten: set[int] = field(default_factory=set)

    def effects(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any], source: Callable[[str], str],
                record: Any, history: Callable[[torch.Tensor, str], str | None] | None = None) -> None:
        """Turn every change of watched state into an effect node at the graph's end, or refuse.

        Values in the user's hands become real numbers now (the capture call's own result). ``history``
        names eager's ``grad_fn`` of a kept tensor (capture/kept_history.py). A container kept in two
        places is put in the second by reading it where the first effect put it (``placed``).
        """
        placed: dict[int, KeptPlace] = {}
        made: dict[int, Any] = {}  # and one copy of its real values in both
        #: (id of a dict, key) of the items a dict's update effect puts in place (``_watch_items`` adds a
        #: watched dict's items after the dict, so the update comes first).
        updated: set[tuple[int, Any]] = set()
        for entry in self.watch.watched:
            if entry.part_of is not None:
                continue  # read through another entry, whose change is the effect
            location, now = entry.location, entry.location.read()
            if now is ABSENT:  # ``del self.cache``, ``prune.remove``'s mask: a replay deletes nothing
                raise refusal(location.describe, "deletes", source)
            if id(entry) in self.watch.arrays and now is self.watch.arrays[id(entry)]:
                location.set(entry.before)  # read, not written: the user's array again
                continue
            if location.place is Place.ITEM and (id(location.owner), location.key) in updated:
                # ``out["c"] = {"c": loss.item()}`` where ``out["c"]`` held a dict: the dict's update is the
                # effect. Set again from here, it put the capture call's values back after every update.
                self.assigned.add(id(entry))
                continue
            scalar = self.watch.inputs.get(id(entry))
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
                    if is_number(now) and is_number(entry.before):
                        ASSIGNED_NUMBERS.add(*location.field)
                elif scalar is None and is_number(entry.before) and is_number(_number_of(now)):
                    # A module's number the step reads, baked, and rebinds for the next call (BYOL's
                    # ``ema.beta = tau(k)``, a Gumbel temperature): a replay would go on reading the
                    # capture call's value. Held by it, and an input from the next capture on.
                    self.pinned.add(id(entry))
                    ASSIGNED_NUMBERS.add(*location.field)
                location.set(real_values(now, made))
                effect_node(graph, f"set {location.describe}", lambda vals, loc=location, t=template:  # type: ignore[misc]  # binds by default arguments
                             loc.write(filled(t, vals)), slots, record)
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
            elif (type(before) is list and snapshot is not None and id(before) in self.watch.carried
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
                if [k for k in before if k in snapshot] != list(snapshot):
                    # ``od.move_to_end(k)``, ``d[k] = d.pop(k)``: a replay's writes keep each key where it is.
                    raise refusal(location.describe, "reorders the keys of", source)
                own = self.watch.itemized.get(id(before), set()) | self.watch.kept_items.get(id(before), {}).keys()
                new = {k: v for k, v in before.items() if k not in own and (k not in snapshot or v is not snapshot[k])}
                if not new:
                    continue
                self.extended.add(id(entry))
                template, slots = template_of(new, node_of, location.describe, source, history=history,
                                              placed=placed)
                for key, item in new.items():
                    note_containers(item, location.describe, _item_of(before, key), placed)
                updated.update((id(before), key) for key in new)
                write_items(before, real_values(new, made), own_method(before, "__setitem__"))
                effect_node(graph, f"update {location.describe}", lambda vals, d=before, t=template:  # type: ignore[misc]  # binds by default arguments
                             write_items(d, filled(t, vals)), slots, record)

    def _set_items(self, entry: Watched, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
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
    return type(a) is type(b) and is_number(a) and a == b


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
    """Whether the step added, removed, replaced or reordered (``move_to_end``) items of a dict."""
    return list(now) != list(snapshot) or any(now[k] is not snapshot[k] for k in snapshot)
