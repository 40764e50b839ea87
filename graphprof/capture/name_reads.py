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

import gc
import sys
import types
from typing import Any, Callable

from graphprof.capture.held_values import GENERATED
from graphprof.capture.load_uses import READ, TRACED, Load, code_loads
from graphprof.capture.sources import installed, is_machinery

#: What a global had before the call where it had nothing.
MISSING = object()
#: A list the step did not change, by the name its holder gives it: (the list, its name, the cell,
#: globals dict or defaults tuple holding it).
Candidate = tuple[list, str, Any]


class NameReads:
    """Traces the user's frames for the length of one capture call (a context manager)."""

    def __init__(self, library: Callable[[str], bool]) -> None:
        self._library = library
        self._codes: dict[types.CodeType, dict[int, Load] | None] = {}  # code -> offset -> its load
        #: Every name loaded, whatever its kind (a local, a closure variable, a global, an attribute).
        self.loaded: set[str] = set()
        #: Every name any code that ran could read: the names and string constants of each code
        #: object (the user's and the libraries'), whether or not the instruction ran.
        self.named: set[str] = set()
        self.dynamic = False
        #: (kind, name) of each load for a use other than appending to the object (``sum(hist)``,
        #: ``len(hist)``, ``h = hist``): what a list the step also extends must not be
        #: (``refuse_reading_extended_lists``). Kinds: ``_KINDS``' values (capture/load_uses.py) and "item"
        #: (``logs["loss"]``).
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
        #: global in this call, its value before: ``MISSING`` where it had none), for ``global calls;
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

    def _loads(self, code: types.CodeType) -> dict[int, Load] | None:
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
            loads = code_loads(code)
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
                                                    frame.f_globals.get(hit.names[0], MISSING))
                    return self._opcode
                use = hit.use
                if use is not None:
                    kind, used, how, alias = use
                    if alias is not None:  # ``hist = self.hist``: the local's loads are the list's too
                        for n in used:
                            self.aliases.setdefault((kind, n), set()).add(alias)
                    elif how is READ:
                        self.read_uses.update((kind, n) for n in used)
                    elif how is TRACED:
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
            if module_globals(referrer):  # ``log = []`` at the top of a script, bound as a default too
                suspect.update(id(v) for k, v in referrer.items() if id(v) in targets and k in self.loaded)
                continue
            suspect.update(id(v) for v in gc.get_referents(referrer) if id(v) in targets)
        return targets - suspect


def _ours(obj: Any) -> bool:
    """A record of graphprof's (a watched entry, a held value or effect of another path, a generated
    check's namespace): it reads nothing while a step runs."""
    if type(obj) is dict:
        return obj.get(GENERATED) is True
    return (type(obj).__module__ or "").startswith("graphprof.")


def module_globals(obj: Any) -> bool:
    """Whether ``obj`` is a module's globals dict (its names are loaded as globals, which are traced)."""
    if type(obj) is not dict:
        return False
    module = sys.modules.get(str(obj.get("__name__")))
    return module is not None and vars(module) is obj
