"""Which closure variables and globals the user's code loaded while one capture call ran.

A path that does not change a list the step keeps holds it with its items
(``Hold.CONTENTS``): it may have read them, or its length, which Python
does not show. With a log appended to on some calls only (``if n % 100 ==
0: history.append(loss.item())``), every append broke the other path's
hold, and the first call after each append captured that path again: one
capture per logging period, each costing about a hundred steps.

The user's frames are traced instruction by instruction during the capture
call (``sys.settrace``; frames of torch, the standard library and installed
packages are not, so their cost is one check per Python call): every load
of a closure variable, a global or a local, and every attribute name, is
noted. A list held in a closure cell, a module global
or a default argument that the call never loaded by name, and that nothing else refers to, was
not read by the step: ``PythonState.held`` holds it as the same object
only. Anything that could reach it otherwise keeps the items held: names
loaded dynamically (``globals()``, ``getattr``, ``vars``, frame
introspection), a debugger or coverage tool already tracing (graphprof
does not replace its tracer), and user code running on threads the trace
does not see (an accelerator's backward: the relief is for CPU steps).
"""

from __future__ import annotations

import dis
import gc
import sys
import types
from collections import deque
from typing import Any, Callable, Iterable

import torch
from torch import nn

from graphprof.capture.held_values import GENERATED, Place
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import installed, is_machinery

#: What a global had before the call where it had nothing.
_MISSING = object()
#: Instructions that assign or delete a global (noted apart from the loads: ``NameReads.stored_globals``).
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
#: Besides ``LOAD_*``: instructions that read a name (a global or attribute imported, a class cell).
_READS = frozenset({"IMPORT_FROM", "IMPORT_NAME", "LOAD_CLASSDEREF", "DELETE_DEREF", "DELETE_NAME"})
#: Variables through which code reaches others without naming them (builtins and modules it calls).
_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "getattr", "gc", "inspect"})
#: Attributes that do the same (``model.eval()`` is not one: an attribute named like a builtin).
_DYNAMIC_ATTRIBUTES = frozenset({"__dict__", "__closure__", "__globals__", "_getframe", "f_globals", "f_locals",
                                 "f_back", "currentframe", "stack", "getmembers", "cell_contents", "get_referrers",
                                 "get_referents"})
#: Instructions that read an attribute (their names are checked against ``_DYNAMIC_ATTRIBUTES``).
_ATTRIBUTE_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "IMPORT_FROM"})
#: A list the step did not change, by the name its holder gives it: (the list, its name, the cell,
#: globals dict or defaults tuple holding it).
Candidate = tuple[list, str, Any]


class NameReads:
    """Traces the user's frames for the length of one capture call (a context manager)."""

    def __init__(self, library: Callable[[str], bool]) -> None:
        self._library = library
        self._codes: dict[types.CodeType, dict[int, _Load] | None] = {}  # code -> offset -> its load
        #: Every name loaded, whatever its kind (a local, a closure variable, a global, an attribute).
        self.loaded: set[str] = set()
        #: Every name any code that ran could read: the names and string constants of each code
        #: object (the user's and the libraries'), whether or not the instruction ran.
        self.named: set[str] = set()
        self.dynamic = False
        #: (kind, name) of each load for a use other than appending to the object (``sum(hist)``,
        #: ``len(hist)``, ``h = hist``): what a list the step also extends must not be
        #: (``refuse_reading_extended_lists``). Kinds: ``_KINDS``' values and "item" (``logs["loss"]``).
        self.read_uses: set[tuple[str, str]] = set()
        #: (kind, name) of each load whose object is subscripted, measured (``len``), summed (``sum``) or
        #: tested for truth: uses that a list of numbers the capture views answers with traced values
        #: (capture/growing_lists.py); for any other list they are reads like ``read_uses``.
        self.traced_uses: set[tuple[str, str]] = set()
        #: (kind, name) -> the (kind, name) of each local assigned the object that name loads
        #: (``hist = self.hist``): its uses are the object's (``names_of``).
        self.aliases: dict[tuple[str, str], set[tuple[str, str]]] = {}
        #: Whether every list watched under (kind, name) has grown in this call (its last item is this
        #: call's): set by the capture once the step's state is watched.
        self.grown: Callable[[tuple[str, str]], bool] = lambda name: False
        #: (id of a globals dict, name) -> (the dict, where the user's code first assigned or deleted that
        #: global in this call, its value before: ``_MISSING`` where it had none), for ``global calls;
        #: calls += 1``: checked against the state the walk found (``refuse_unseen_global_writes``) and
        #: put back when the capture is refused (``put_back_unseen_globals``).
        self.stored_globals: dict[tuple[int, str], tuple[dict, str, Any]] = {}
        #: Called with each new frame of library code (capture/foreign_calls.py).
        self.on_library_call: Callable[[types.FrameType], None] | None = None
        self.active = False

    def __enter__(self) -> "NameReads":
        if sys.gettrace() is None:  # a debugger's or coverage tool's tracer is left alone
            self.active = True
            sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            sys.settrace(None)

    def _loads(self, code: types.CodeType) -> dict[int, _Load] | None:
        """Offset -> each load in ``code`` (what it reads, and for what); None for library code."""
        if code in self._codes:
            return self._codes[code]
        if not is_machinery(code.co_filename):  # graphprof's recorder runs in the call, reading its own fields
            self.named.update(code.co_names)
            self.named.update(c for c in code.co_consts if type(c) is str)
        loads = None
        # Installed code cannot name the user's variables: what it is given comes from the user's
        # frames or from objects the referrer test looks at.
        if not (self._library(code.co_filename) or installed(code.co_filename)):
            loads = {}
            instructions = [ins for ins in dis.get_instructions(code) if ins.opname != "EXTENDED_ARG"]
            for j, ins in enumerate(instructions):
                if ins.opname in _GLOBAL_WRITES:
                    loads[ins.offset] = _Load((ins.argval,), None, False, stores=True)
                    continue
                if not (ins.opname.startswith("LOAD_") or ins.opname in _READS):
                    continue
                # Any kind of name, each name of a fused instruction (``LOAD_FAST_LOAD_FAST`` in 3.13):
                # a name loaded as a local in one frame counts as loaded as a global too.
                names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
                names = tuple(n for n in names if isinstance(n, str))
                if names:
                    dynamic = _DYNAMIC_ATTRIBUTES if ins.opname in _ATTRIBUTE_READS else _DYNAMIC
                    loads[ins.offset] = _Load(names, _read_use(instructions, j),
                                              any(n in dynamic for n in names))
        self._codes[code] = loads
        return loads

    def _call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        if self._loads(frame.f_code) is None:
            if self.on_library_call is not None:
                self.on_library_call(frame)
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._opcode

    def _opcode(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        # Runs for every instruction of the user's frames in the capture call: one lookup per load.
        if event == "opcode":
            loads = self._codes.get(frame.f_code)
            hit = loads.get(frame.f_lasti) if loads else None
            if hit is not None:
                self.loaded.update(hit.names)
                if hit.stores:  # (an opcode event comes before its instruction runs: the value is the old one)
                    key = (id(frame.f_globals), hit.names[0])
                    if key not in self.stored_globals:
                        self.stored_globals[key] = (frame.f_globals, f"{frame.f_code.co_filename}:{frame.f_lineno}",
                                                    frame.f_globals.get(hit.names[0], _MISSING))
                    return self._opcode
                use = hit.use
                if use is not None:
                    kind, used, how, alias = use
                    if alias is not None:  # ``hist = self.hist``: the local's loads are the list's too
                        for n in used:
                            self.aliases.setdefault((kind, n), set()).add(alias)
                    elif how is _READ:
                        self.read_uses.update((kind, n) for n in used)
                    elif how is _TRACED:
                        self.traced_uses.update((kind, n) for n in used)
                    else:  # ``hist[-1]``: this call's own value once the list has grown; else a subscript
                        self.traced_uses.update((kind, n) for n in used if not self.grown((kind, n)))
                if hit.dynamic:
                    self.dynamic = True
        return self._opcode

    def records(self) -> set[int]:
        """ids of the records this trace keeps that hold the user's values (``stored_globals``' entries)."""
        return {id(record) for record in self.stored_globals.values()}

    def unread(self, candidates: list[Candidate]) -> set[int]:
        """ids of the ``candidates`` the call did not read.

        A candidate is unread when its name was never loaded, no name was
        loaded dynamically, and everything that refers to it is its own
        holder, a frame, or one of graphprof's records (``_ours``).
        """
        if not self.active or self.dynamic:
            return set()
        named = [c for c in candidates if c[1] not in self.loaded]
        if not named:
            return set()
        allowed = {id(c[2]) for c in named} | {id(c) for c in candidates} | {id(candidates)}
        targets = {id(c[0]) for c in named}
        suspect: set[int] = set()
        for referrer in gc.get_referrers(*(c[0] for c in named)):
            if isinstance(referrer, types.FrameType) or id(referrer) in allowed or _ours(referrer):
                continue
            if _module_globals(referrer):  # ``log = []`` at the top of a script, bound as a default too
                suspect.update(id(v) for k, v in referrer.items() if id(v) in targets and k in self.loaded)
                continue
            suspect.update(id(v) for v in gc.get_referents(referrer) if id(v) in targets)
        return targets - suspect


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


_APPEND, _READ, _LAST, _TRACED, _ALIAS = "append", "read", "last", "traced", "alias"
#: A load's use other than appending: (kind, names, ``_READ``, ``_LAST``, ``_TRACED`` or ``_ALIAS``,
#: and for ``_ALIAS`` the (kind, name) of the local it is assigned to).
Use = tuple[str, tuple[str, ...], str, "tuple[str, str] | None"]


class _Load:
    """One load instruction of the user's code: the names it reads, what for (None: appending to
    the object, or a constant that names nothing), and whether it reaches names dynamically; or
    (``stores``) an instruction that assigns or deletes the global it names."""

    __slots__ = ("names", "use", "dynamic", "stores")

    def __init__(self, names: tuple[str, ...], use: Use | None, dynamic: bool, stores: bool = False) -> None:
        self.names, self.use, self.dynamic, self.stores = names, use, dynamic, stores


def _read_use(instructions: list[dis.Instruction], j: int) -> Use | None:
    """What the load ``instructions[j]`` is used for, where that is not appending to it."""
    ins = instructions[j]
    names: tuple[str, ...]
    if ins.opname == "LOAD_CONST":
        kind, names = "item", ((ins.argval,) if isinstance(ins.argval, str) else ())
    else:
        kind = _KINDS.get(ins.opname, "")
        names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        names = tuple(n for n in names if isinstance(n, str))
    if not kind or not names:
        return None
    how = _use(instructions, j)
    if len(names) > 1 and how is not None:  # a fused load: only the last name's use is known
        how = _READ
    alias = None
    if how is _ALIAS:
        store = instructions[j + 2 if ins.opname == "LOAD_CONST" else j + 1]
        alias = ("cell" if store.opname == "STORE_DEREF" else "fast", str(store.argval))
    return (kind, names, how, alias) if how is not None and how is not _APPEND else None
#: How each load instruction reaches a name: a closure cell, a global, a local (a default
#: argument's parameter) or an attribute.
_KINDS = {"LOAD_DEREF": "cell", "LOAD_CLASSDEREF": "cell", "LOAD_CLOSURE": "cell", "LOAD_GLOBAL": "global",
          "LOAD_NAME": "global", "LOAD_FAST": "fast", "LOAD_FAST_CHECK": "fast", "LOAD_FAST_AND_CLEAR": "fast",
          "LOAD_FAST_LOAD_FAST": "fast", "LOAD_FAST_BORROW": "fast", "LOAD_FAST_BORROW_LOAD_FAST_BORROW": "fast",
          "LOAD_ATTR": "attribute", "LOAD_METHOD": "attribute", "LOAD_SUPER_ATTR": "attribute"}


def _use(instructions: list[dis.Instruction], j: int) -> str | None:
    """What the code does with the object loaded by ``instructions[j]``: appends to it
    (``hist.append``), reads its last item (``hist[-1]``), or anything else (read). For a string
    constant: the use of the item it subscripts (``logs["loss"].append``), None where it is not
    a subscript (a constant is not a name)."""
    k = j + 1
    if instructions[j].opname == "LOAD_CONST":
        if k >= len(instructions) or instructions[k].opname != "BINARY_SUBSCR":
            return None
        k += 1
    if k >= len(instructions):
        return _READ
    nxt = instructions[k]
    if nxt.opname in ("LOAD_METHOD", "LOAD_ATTR") and nxt.argval in ("append", "extend"):
        return _APPEND
    if nxt.opname in ("STORE_FAST", "STORE_DEREF") and isinstance(nxt.argval, str):
        return _ALIAS
    if (nxt.opname == "LOAD_CONST" and nxt.argval == -1 and k + 1 < len(instructions)
            and instructions[k + 1].opname == "BINARY_SUBSCR"):
        return _LAST
    start = j - 1 if instructions[j].opname in ("LOAD_CONST", "LOAD_ATTR") else j  # where the object's load began
    if _truth_test(nxt) or _measured(instructions, start, k) or _subscripted(instructions, k):
        return _TRACED
    return _READ


#: Instructions an index may be made of (``hist[-k:]``, ``hist[i - 1]``) between the list's load and its subscript.
_INDEX_PARTS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_NAME", "UNARY_NEGATIVE",
                          "BUILD_SLICE", "BINARY_OP", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})


def _truth_test(ins: dis.Instruction) -> bool:
    """``if hist:``, ``x if hist else y``, ``not hist``: the object's truth is asked for."""
    name = ins.opname
    return (name in ("UNARY_NOT", "TO_BOOL") or name.startswith("JUMP_IF_")
            or (name.startswith("POP_JUMP") and (name.endswith("IF_FALSE") or name.endswith("IF_TRUE"))))


def _measured(instructions: list[dis.Instruction], start: int, k: int) -> bool:
    """``len(hist)``, ``sum(hist)``: the object is the one argument of a call of the builtin."""
    if start < 1 or k >= len(instructions):
        return False
    callee = instructions[start - 1]
    if callee.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or callee.argval not in ("len", "sum"):
        return False
    call = instructions[k + 1] if instructions[k].opname == "PRECALL" and k + 1 < len(instructions) else instructions[k]
    return call.opname == "CALL" and call.arg == 1


def _subscripted(instructions: list[dis.Instruction], k: int) -> bool:
    """``hist[-3:]``, ``hist[i]``: the next subscript takes the object (the stack, from ``k`` on, holds it
    and an index made of loads and arithmetic)."""
    depth = 1
    for ins in instructions[k:k + 8]:
        if ins.opname == "BINARY_SUBSCR":
            return depth == 2
        if ins.opname == "BINARY_SLICE":  # ``hist[a:b]`` from Python 3.12: the object, start and stop
            return depth == 3
        if ins.opname not in _INDEX_PARTS:
            return False
        depth += dis.stack_effect(ins.opcode, ins.arg)
    return False


def _ours(obj: Any) -> bool:
    """A record of graphprof's (a watched entry, a held value or effect of another path, a generated
    check's namespace): it reads nothing while a step runs."""
    if type(obj) is dict:
        return obj.get(GENERATED) is True
    return (type(obj).__module__ or "").startswith("graphprof.")


def _module_globals(obj: Any) -> bool:
    """Whether ``obj`` is a module's globals dict (its names are loaded as globals, which are traced)."""
    if type(obj) is not dict:
        return False
    module = sys.modules.get(str(obj.get("__name__")))
    return module is not None and vars(module) is obj


def watched_names(where: Any) -> tuple[tuple[str, str], ...]:
    """How code loads a watched value (a ``Location``), as ``NameReads.read_uses`` notes loads: its
    closure variable, global, attribute, default argument or string key in a dict."""
    if where.place is Place.CELL:
        return (("cell", str(where.describe.rsplit(".", 1)[-1])),)
    if where.place is Place.ATTRIBUTE:
        return (("attribute", str(where.key)),)
    if where.place is Place.ITEM and isinstance(where.key, str):
        if _module_globals(where.owner):
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
        if before is _MISSING:
            globals_.pop(key[1], None)
        else:
            globals_[key[1]] = before
