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
from typing import Any, Callable, Iterable

import torch
from torch import nn

from graphprof.capture.held_values import GENERATED, Place

#: Besides ``LOAD_*``: instructions that read a name (a global or attribute imported, a class cell).
_READS = frozenset({"IMPORT_FROM", "IMPORT_NAME", "LOAD_CLASSDEREF", "DELETE_DEREF", "DELETE_GLOBAL", "DELETE_NAME"})
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
        self._codes: dict[types.CodeType, dict[int, tuple[str, ...]] | None] = {}
        #: Every name loaded, whatever its kind (a local, a closure variable, a global, an attribute).
        self.loaded: set[str] = set()
        #: Every name any code that ran could read: the names and string constants of each code
        #: object (the user's and the libraries'), whether or not the instruction ran.
        self.named: set[str] = set()
        self.dynamic = False
        self._dynamic_at: set[tuple[types.CodeType, int]] = set()  # (code, offset) of dynamic loads
        self.active = False

    def __enter__(self) -> "NameReads":
        if sys.gettrace() is None:  # a debugger's or coverage tool's tracer is left alone
            self.active = True
            sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            sys.settrace(None)

    def _loads(self, code: types.CodeType) -> dict[int, tuple[str, ...]] | None:
        """Offset -> the names each load in ``code`` reads; None for library code."""
        if code in self._codes:
            return self._codes[code]
        self.named.update(code.co_names)
        self.named.update(c for c in code.co_consts if type(c) is str)
        loads = None
        if not (self._library(code.co_filename) or _installed(code.co_filename)):
            loads = {}
            for ins in dis.get_instructions(code):
                if not (ins.opname.startswith("LOAD_") or ins.opname in _READS):
                    continue
                # Any kind of name, each name of a fused instruction (``LOAD_FAST_LOAD_FAST`` in 3.13):
                # a name loaded as a local in one frame counts as loaded as a global too.
                names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
                names = tuple(n for n in names if isinstance(n, str))
                if names:
                    loads[ins.offset] = names
                    dynamic = _DYNAMIC_ATTRIBUTES if ins.opname in _ATTRIBUTE_READS else _DYNAMIC
                    if any(n in dynamic for n in names):
                        self._dynamic_at.add((code, ins.offset))
        self._codes[code] = loads
        return loads

    def _call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "call" or self._loads(frame.f_code) is None:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._opcode

    def _opcode(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            loads = self._codes.get(frame.f_code)
            hit = loads.get(frame.f_lasti) if loads else None
            if hit is not None:
                self.loaded.update(hit)
                if not self.dynamic and (frame.f_code, frame.f_lasti) in self._dynamic_at:
                    self.dynamic = True
        return self._opcode

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


def _installed(filename: str) -> bool:
    """Code of an installed package (transformers, numpy): it cannot name the user's variables, and
    what it is given comes from the user's frames or from objects the referrer test looks at."""
    return "site-packages" in filename or "dist-packages" in filename


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


def list_candidates(watched: Iterable[Any], changed: set[int]) -> list[Candidate]:
    """The lists held in a closure cell, a module global or a default argument that the step did not
    change (``changed``: ids of its extended or assigned entries), as ``NameReads.unread`` takes them."""
    found: list[Candidate] = []
    for entry in watched:
        value, where = entry.before, entry.location
        if type(value) is not list or id(entry) in changed:
            continue
        if where.place is Place.ITEM and type(where.owner) is tuple and isinstance(where.key, int):
            found.append((value, where.describe, where.owner))  # a default argument's value
        elif where.place is Place.CELL and isinstance(where.owner, types.CellType):
            found.append((value, where.describe.rsplit(".", 1)[-1], where.owner))
        elif where.place is Place.ITEM and _module_globals(where.owner) and isinstance(where.key, str):
            found.append((value, where.key, where.owner))
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
    candidates = list_candidates(python.watched, python.extended | python.assigned)
    return names.unread(candidates) if candidates else set()
