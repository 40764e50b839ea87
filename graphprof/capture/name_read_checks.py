"""What the capture concludes from the names the step's code loaded (``NameReads``, capture/name_reads.py).

Why a module of its own: ``NameReads`` only notes what the user's frames
loaded while the capture call ran. Turning those notes into decisions about
the step's watched state is a separate job, done once the step has run: which
lists it kept but never read (held as the same object only), whether a
module attribute was named by any code that ran, whether it read a list it
also extends or rebuilt a container from the old one (refused: a replay
would use the capture call's items), and which globals it assigned that the
walk of its state did not find (refused, and put back when the capture is).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable

import torch
from torch import nn

from graphprof.capture.held_values import Place
from graphprof.capture.name_reads import MISSING, Candidate, NameReads, module_globals
from graphprof.capture.scalars import DataDependentError


def unnamed_attributes(names: NameReads, modules: Iterable[nn.Module], leaves: Iterable[Any],
                       params: Iterable[Any]) -> Callable[[str], bool]:
    """A test that no code the capture call ran could have read a module attribute of this name.

    An attribute of an ``nn.Module`` is read by code that names it (``self.training``,
    ``getattr(self, "gradient_checkpointing", False)``): a name that no code object that ran has
    among its names or string constants was not read, whatever that code's branches did. A
    Linear's ``in_features`` is such a field, and so, in a step without dropout or batch norm,
    is every module's ``training`` flag. The test says "read" (False) for every name when the
    trace did not run, a name was loaded dynamically, the step is not on the CPU, or a module is
    a ScriptModule (its attributes are read by TorchScript, not by Python code).
    """
    if (not names.active or names.dynamic or not on_the_cpu(leaves, params)
            or any(isinstance(m, torch.jit.ScriptModule) for m in modules)):
        return lambda name: False
    named = frozenset(names.named)
    return lambda name: name not in named


def watched_names(where: Any) -> tuple[tuple[str, str], ...]:
    """How code loads a watched value (a ``Location``), as ``NameReads.read_uses`` notes loads: its
    closure variable, global, attribute, default argument or string key in a dict."""
    if where.place is Place.CELL:
        return (("cell", str(where.describe.rsplit(".", 1)[-1])),)
    if where.place is Place.ATTRIBUTE:
        return (("attribute", str(where.key)),)
    if where.place is Place.ITEM and isinstance(where.key, str):
        if module_globals(where.owner):
            return (("global", where.key),)
        if where.describe == where.key:  # a keyword-only default, labelled by its parameter alone
            return (("fast", where.key),)
        return (("item", where.key),)
    if where.place is Place.ITEM and type(where.owner) is tuple and where.keeper is None:
        return (("fast", str(where.describe)),)  # a default argument's value, named after its parameter
    return ()


def names_of(where: Any, names: NameReads) -> set[tuple[str, str]]:
    """``watched_names`` of a location, with the locals the step assigned its value to (``hist = self.hist``),
    and theirs in turn."""
    found = set(watched_names(where))
    todo = list(found)
    while todo:
        for alias in names.aliases.get(todo.pop(), ()):
            if alias not in found:
                found.add(alias)
                todo.append(alias)
    return found


def grown_lists(watched: Iterable[Any]) -> Callable[[tuple[str, str]], bool]:
    """``NameReads.grown``: whether every watched list loaded as (kind, name) is longer than when
    the step began, so that its last item is one the step appended (a graph value, not a constant)."""
    by_name: dict[tuple[str, str], list[Any]] = {}
    for entry in watched:
        if type(entry.before) is list and entry.snapshot is not None:
            for name in watched_names(entry.location):
                by_name.setdefault(name, []).append(entry)

    def grown(name: tuple[str, str]) -> bool:
        named = by_name.get(name, ())
        return bool(named) and all(len(e.before) > len(e.snapshot) for e in named)

    return grown


def refuse_reading_extended_lists(python: Any, names: NameReads) -> None:
    """Refuse a step that reads a list it also extends (``python``: a ``PythonState`` after its
    effects): ``sum(hist[-3:])`` or ``len(hist)`` after ``hist.append(loss.item())`` would be
    computed from the capture call's items and length, as constants, on every replay, and
    silently differ from eager. Reading back the item just appended (``hist[-1]``) is a graph
    value, and allowed. Without a trace nothing is known. Names loaded dynamically (``getattr``,
    ``vars``) may read a list unseen, but a read seen is one all the same: it refuses."""
    if not names.active or not (names.read_uses or names.traced_uses):
        return
    extended = {id(e.before) for e in python.places.watched if id(e) in python.changes.extended}
    for entry in python.places.watched:  # each name the list is reached by (``hist``, ``trainer.hist``)
        if id(entry.before) in extended and type(entry.before) in (list, deque):
            # ``len(hist)``, ``hist[-3:]``: answered by the list's view with traced values where it had one
            reads = names.read_uses if id(entry) in python.lists.viewed else names.read_uses | names.traced_uses
            if any(name in reads for name in names_of(entry.location, names)):
                raise DataDependentError(
                    f"the step reads {entry.location.describe}, a list it also appends to: a replay would read "
                    "the items and length the capture call found, not the ones eager finds")


def refuse_rebuilt_containers(python: Any, names: NameReads) -> None:
    """Refuse a step that builds a list or dict it keeps anew from what it read of the old one
    (``history = history + [loss.item()]``, ``self.window = self.window[-9:] + [v]``).

    Why: the new container is assigned as the capture call made it, with the
    old items in it as constants: every replay put back the capture call's
    history plus one number (eager's grows by one per call), silently. A
    container the step assigns without reading the old one (``self.log = []``)
    is a graph value like any other.
    """
    reads = names.read_uses | names.traced_uses  # ``self.window[-9:] + [v]`` reads the old items too
    if not names.active or names.dynamic or not reads:
        return
    for entry in python.places.watched:
        if id(entry.before) in python.places.carried:
            continue  # its tensors are read where they are kept, its length held (``_carried_tensors``)
        if id(entry) in python.changes.assigned and type(entry.before) in (list, dict) and entry.before:
            if any(name in reads for name in names_of(entry.location, names)):
                raise DataDependentError(
                    f"the step builds {entry.location.describe} anew from the {type(entry.before).__name__} it "
                    "held: a replay would build it from the capture call's items, not the ones eager finds "
                    "(change it in place: .append(), .update())")


def list_candidates(watched: Iterable[Any], changed: set[int]) -> list[Candidate]:
    """The lists held in a closure cell, a module global or a default argument that the step did not
    change (``changed``: ids of its extended or assigned entries), as ``NameReads.unread`` takes them."""
    found: list[Candidate] = []
    for entry in watched:
        value, where = entry.before, entry.location
        if type(value) is not list or id(entry) in changed:
            continue
        for kind, name in watched_names(where):
            # A closure variable, a global, a positional default (not a keyword-only one).
            if kind in ("cell", "global") or (kind == "fast" and type(where.owner) is tuple):
                found.append((value, name, where.owner))
    return found


def on_the_cpu(leaves: Iterable[Any], params: Iterable[Any]) -> bool:
    """Whether every tensor argument and parameter is on the CPU, where the whole step runs on the
    traced thread: an accelerator's backward runs on threads of its own, where hooks and
    recomputed forwards are not traced."""
    return all(t.device.type == "cpu" for t in (*(t for t in leaves if isinstance(t, torch.Tensor)), *params))


def unread_lists(python: Any, names: NameReads, leaves: Iterable[Any], params: Iterable[Any]) -> set[int]:
    """ids of the lists ``python`` (a ``PythonState``) watches in closure cells and globals that the
    capture call did not read (``NameReads.unread``). Only for a step on the CPU (``on_the_cpu``)."""
    if not on_the_cpu(leaves, params):
        return set()
    changes = python.changes
    candidates = list_candidates(python.places.watched, changes.extended | changes.assigned | changes.rewritten)
    return names.unread(candidates) if candidates else set()


def _found_globals(python: Any) -> set[tuple[int, Any]]:
    """(id of the dict, key) of every watched dict entry of ``python`` (a ``PythonState``, or None)."""
    if python is None:
        return set()
    return {(id(e.location.owner), e.location.key) for e in python.places.watched if e.location.place is Place.ITEM}


def refuse_unseen_global_writes(python: Any, names: NameReads) -> None:
    """Refuse a step whose code assigned a global that is not among the state found before the call
    (``python``: a ``PythonState``).

    Why: the walk finds the globals of the functions it can name. A function
    reached otherwise (``getattr(schedules, cfg.name)(it)``, a callback
    registered somewhere the walk does not look) counted or logged in its
    module's globals in the capture call only, and every replay left them as
    they were, silently. A global the walk found is held and written back by
    the replay; any other one refuses the capture.
    """
    if not names.active or not names.stored_globals:
        return
    found = _found_globals(python)
    for key, (globals_, where, _) in names.stored_globals.items():
        if key not in found:
            raise DataDependentError(
                f"the step's code at {where} assigns the global {key[1]!r} of {globals_.get('__name__')}, which "
                "graphprof did not find among the step's state before the call: a replay would not assign it")


def put_back_unseen_globals(names: NameReads, python: Any) -> None:
    """Give the globals the refused capture call assigned, and that are not watched state (which is put
    back with the rest of ``python``), the values they had before it: the fallback runs the call
    again, and a counter counted twice."""
    found = _found_globals(python)
    for key, (globals_, _, before) in names.stored_globals.items():
        if key in found:
            continue
        if before is MISSING:
            globals_.pop(key[1], None)
        else:
            globals_[key[1]] = before
