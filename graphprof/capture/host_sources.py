"""Python's own sources of values inside a captured step: clocks and random numbers.

A replay does not run the step's Python, so a value Python draws from
outside the graph would be frozen at the capture call's value:

* **clocks** (``time.time()``, ``perf_counter()``, ``monotonic()``, their
  ``_ns`` forms, ``process_time()``) called by the user's code become input
  scalars: graph nodes that read the clock when the replay reaches them, so
  ``self.elapsed += time.perf_counter() - t0`` keeps counting as in eager,
  under whatever name the step's functions call them (``from time import
  perf_counter``, ``timeit.default_timer``, ``clock = time.time``: see
  capture/bound_names.py); ``datetime.now()`` refuses (capture/clock_dates.py);
  the time as text (``time.ctime()``) in a line the step only prints is
  each replay's own (``time_texts``);
* **output**: ``print(...)`` and ``logging`` calls made by the user's code
  print now and leave a host node that prints again, with that call's
  values, on every replay (values read from tensors are slots filled at run
  time; a tensor or an object that is not a number or a string refuses);
  so do its own writes to ``sys.stdout`` and ``sys.stderr``
  (``sys.stderr.write(".")``), which ``sys`` is given stand-ins for while the
  step is captured. The capture call's own output is made when the capture
  is committed: one refused later in the step runs again another way, which
  prints it again. A file the step opens (``open()``) refuses the capture:
  what it reads or writes would not be read or written again; so does
  ``next()`` on an iterator the calling code keeps between calls (a
  DataLoader's, a generator: a replay would not draw the next batch), before
  it draws, so that the step run another way draws that same item; and so
  do ``torch.save``, ``os`` and ``shutil`` calls that write, move or remove
  files (a checkpoint saved every N steps would be saved once);
* **warnings** issued by the step, torch's Python included, are issued again on every
  replay (``step_warnings``);
* **random numbers** drawn with ``random`` (module functions and
  ``random.Random`` instances) or numpy's legacy global ``numpy.random``
  functions refuse the capture (``DataDependentError`` naming the line): a
  replay cannot redraw them, and a decision taken on one would repeat. The
  step is then profiled another way, with one warning.

Calls from torch and graphprof are left alone: only the user's code is
patched in effect. numpy ``Generator`` and ``RandomState`` objects are C
types that cannot be patched: the ones the step keeps are found, and their
states compared, by ``numpy_draws``.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import os
import random
import shutil
import sys
import time
import types
import warnings
from types import FrameType
from typing import Any, Callable, Iterable, Iterator

import torch

from graphprof.capture.bound_names import wrapped_names
from graphprof.capture.clock_dates import date_stand_ins
from graphprof.capture.echo_streams import EchoStream, put_stream
from graphprof.capture.host_nodes import SILENT_AGAIN, effect_node, filled, input_scalar, real_values, template_of
from graphprof.capture.printed_tensors import autograd_suffix, printed
from graphprof.capture.printed_texts import PRINTED_TEXTS, PrintedTexts
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.sources import from_user
from graphprof.capture.environment import ENVIRONMENT_FILES, EnvironmentReads
from graphprof.capture.step_warnings import StepWarning, wrapped_warn
from graphprof.capture.time_texts import TIME_TEXTS, time_text

#: What a step may do to files besides ``open()``: save a checkpoint, move or remove files.
_TORCH_FILES = ("save",)
_OS_FILES = ("rename", "replace", "remove", "unlink", "mkdir", "makedirs", "rmdir", "removedirs", "symlink", "link",
             "truncate", "system")
_SHUTIL_FILES = ("copy", "copy2", "copyfile", "copytree", "move", "rmtree")
_CLOCKS = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
           "process_time_ns")
#: Why a step under autograd's anomaly detection refuses: its backward reads every gradient's values.
_ANOMALY_CHECKS = ("autograd's anomaly detection checks every gradient for NaN on the host, which a static "
                   "graph cannot replay")
_ANOMALY_FILE = torch.autograd.anomaly_mode.__file__
#: torch's global setters a step may call and put back before it returns: the graph holds what the ops
#: did while set (a tensor made float64), but a replay would not set it again around them (the dtype of
#: what it makes, the digits its prints show, the kernels chosen), so a call of one refuses.
_TORCH_SETTERS = ("set_default_dtype", "set_printoptions", "use_deterministic_algorithms", "set_num_threads",
                  "set_float32_matmul_precision", "set_default_tensor_type")
#: random.Random methods every other drawing method goes through.
_RANDOM_CORE = ("random", "getrandbits", "randbytes", "seed", "setstate")


def _kept_by(iterator: Any, frame: FrameType) -> str | None:
    """The name under which the calling code keeps ``iterator`` between calls (a global, a closure
    cell, an attribute of ``self``, or one item into a list or dict of those), or None for one it
    made itself (``next(iter(x))``, ``next(self.parameters())``)."""
    places: list[tuple[str, Any]] = list(frame.f_globals.items())
    code = frame.f_code
    places += [(name, frame.f_locals.get(name)) for name in code.co_freevars]
    owner = frame.f_locals.get("self")
    if owner is not None and type(getattr(owner, "__dict__", None)) is dict:
        places += [(f"self.{k}", v) for k, v in vars(owner).items()]
    for name, value in places:
        if value is iterator:
            return name
        if type(value) in (list, tuple):
            for i, item in enumerate(value):
                if item is iterator:
                    return f"{name}[{i}]"
        if type(value) is dict:
            for key, item in value.items():
                if item is iterator:
                    return f"{name}[{key!r}]"
    return None


#: Torch's immutable descriptions of a tensor (``print(x.dtype, x.device)``): the same in every replay.
_TORCH_CONSTANTS = (torch.dtype, torch.device, torch.layout, torch.memory_format)


def _opaque(value: Any) -> bool:
    """Objects an output call passes along unchanged: the logger itself, a stream (``file=sys.stderr``),
    a dtype or device (a graph is captured for its inputs' dtypes and devices)."""
    return (isinstance(value, (logging.Logger, *_TORCH_CONSTANTS))
            or callable(getattr(value, "write", None)))


class HostSources:
    """Patches clocks and random sources for the length of one capture."""

    def __init__(self, graph: torch.fx.Graph, record: Callable[[], Any], source: Callable[[], str],
                 library: Callable[[str], bool], node_of: Callable[[torch.Tensor], Any]) -> None:
        self.graph = graph
        self.node_of = node_of
        self.record = record
        self.source = source
        self.library = library
        #: The capture call's own output, made when the capture is committed (``flush``): a capture
        #: refused later in the step is run again another way, which prints it again.
        self.pending: list[Callable[[], Any]] = []
        #: Texts of traced numbers the step formats only for ``print``: the replay formats them.
        self.texts = PrintedTexts()
        #: Where the step's own code changed the warning filters, first (None: it did not).
        self.filters_changed: str | None = None
        self._filters: tuple[Any, tuple, Any] = (None, (), None)
        #: The warnings the replay issues, in order.
        self.step_warnings: list[StepWarning] = []
        #: The environment variables the step read, held between calls.
        self.environment = EnvironmentReads(lambda skip: from_user(skip, library, depth=3))

    def flush(self) -> None:
        """Make the capture call's output, in the order the step made it."""
        pending, self.pending = self.pending, []
        for write in pending:
            write()

    @contextlib.contextmanager
    def patched(self, functions: Iterable[types.FunctionType] = ()) -> Iterator[None]:
        """Inside: the sources are patched (``functions``: the user's functions the step can run, whose
        own names of the clocks are patched too: capture/bound_names.py)."""
        undo: list[Callable[[], None]] = []
        if torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled():
            raise DataDependentError(_ANOMALY_CHECKS)
        try:
            clocks = self._wrapped_clocks(functions)
            clocks.__enter__()

            def put_back_clocks() -> None:
                clocks.__exit__(None, None, None)
            undo.append(put_back_clocks)
            for name, value in list(vars(random).items()):
                if getattr(value, "__self__", None) is getattr(random, "_inst", None) and callable(value):
                    self._patch(undo, random, name, self._refuse_draw(f"random.{name}"))
            for name in _RANDOM_CORE:
                if hasattr(random.Random, name):
                    self._patch(undo, random.Random, name, self._refuse_draw(f"random.Random.{name}"))
            self._patch(undo, builtins, "print", self._echo("print", ()))
            PRINTED_TEXTS.append(self.texts)
            undo.append(lambda: PRINTED_TEXTS.remove(self.texts))
            self._patch(undo, builtins, "open", self._refuse("opens a file", "read or write again"))
            self._patch(undo, builtins, "next", self._refuse_next)
            self._patch(undo, os._Environ, "__getitem__", self.environment.reading)
            self._patch(undo, os._Environ, "__iter__", self.environment.listing)
            self._patch(undo, torch, "set_anomaly_enabled", self._anomaly_switch)
            for name in _TORCH_SETTERS:
                if hasattr(torch, name):
                    self._patch(undo, torch, name, self._refuse(f"calls torch.{name}", "set again around its ops"))
            for name in ("putenv", "unsetenv"):
                self._patch(undo, os, name, self._refuse(f"calls os.{name}", "call again"))
            for name in ("__setitem__", "__delitem__"):  # (``os.putenv`` alone leaves os.environ as it was)
                self._patch(undo, os._Environ, name, self._refuse("sets an environment variable", "set again",
                                                                  ENVIRONMENT_FILES))
            for owner, names in ((torch, _TORCH_FILES), (os, _OS_FILES), (shutil, _SHUTIL_FILES)):
                for name in names:
                    if hasattr(owner, name):
                        self._patch(undo, owner, name, self._refuse(f"calls {owner.__name__}.{name}", "call again"))
            for name in ("stdout", "stderr"):
                stream = getattr(sys, name)
                if stream is not None:
                    stand_in = EchoStream(stream, name, self)
                    setattr(sys, name, stand_in)
                    undo.append(functools.partial(put_stream, name, stream, stand_in))
            self._patch(undo, logging.Logger, "_log", self._echo("logging", (logging.__file__,)))
            self._patch(undo, warnings, "warn", lambda original: wrapped_warn(original, self._warned))
            self._filters = (warnings.filters, tuple(warnings.filters), warnings.showwarning)
            self._patch(undo, warnings, "_filters_mutated", self._filters_mutated)
            numpy_random = sys.modules.get("numpy.random")
            if numpy_random is not None:
                legacy = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
                for name, value in list(vars(numpy_random).items()):
                    if legacy is not None and getattr(value, "__self__", None) is legacy:
                        self._patch(undo, numpy_random, name, self._refuse_draw(f"numpy.random.{name}"))
            yield
        finally:
            for step in reversed(undo):
                step()

    @staticmethod
    def _patch(undo: list[Callable[[], None]], owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
        had = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, wrap(original))
        undo.append((lambda: setattr(owner, name, original)) if had else (lambda: delattr(owner, name)))

    def _wrapped_clocks(self, functions: Iterable[types.FunctionType]) -> contextlib.AbstractContextManager[None]:
        """The clocks and the time as text, as ``time``'s attributes and under the user's names for them."""
        originals = {(time, name): getattr(time, name) for name in (*TIME_TEXTS, *_CLOCKS)}
        wrapped = {id(f): self._time_text(name, time.time, f) if name in TIME_TEXTS else self._clock(f)
                   for (_, name), f in originals.items()}
        wrapped.update(date_stand_ins(self._refuse_date))  # ``datetime.now()``: refused (capture/clock_dates.py)
        timeit = sys.modules.get("timeit")  # ``timeit.default_timer`` is ``time.perf_counter``
        return wrapped_names(originals, wrapped, functions, [vars(timeit)] if timeit is not None else [])

    def _refuse_date(self, what: str) -> None:
        if from_user((), self.library, depth=3):  # frames: from_user, this, the stand-in's read, its caller
            raise DataDependentError(f"the step reads the time with {what}() at {self.source()}, which a replayed "
                                     "graph would not read again")

    def _clock(self, original: Callable[[], Any]) -> Callable[[], Any]:
        sources = self

        @functools.wraps(original)
        def clock() -> Any:
            value = original()
            if not from_user((), sources.library):
                return value
            return input_scalar(sources.graph, value, original, f"time.{original.__name__}", sources.record(),
                                sources.source(), during_step=f"the time (time.{original.__name__})")

        return clock

    def _time_text(self, name: str, clock: Callable[[], float], original: Callable[..., str]) -> Callable[..., str]:
        sources = self
        return time_text(name, original, self.texts, lambda: from_user((), sources.library, depth=3),
                         lambda: input_scalar(sources.graph, clock(), clock, "time.time", sources.record(),
                                              sources.source(), during_step="the time (time.time)"),
                         self.source)

    def _echo(self, what: str, skip_files: tuple[str, ...]) -> Callable[[Any], Any]:
        sources = self

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def echo(*args: Any, **kwargs: Any) -> Any:
                if not from_user(skip_files, sources.library):
                    if sources.texts.holds_markers((args, kwargs)):  # never expected: see printed_texts
                        raise DataDependentError(f"{what} of a formatted value at {sources.source()} "
                                                 "cannot be replayed by a static graph")
                    return original(*args, **kwargs)
                args, kwargs = sources.texts.expand((args, kwargs))
                where = sources.source()
                suffixes: dict[int, str] = {}  # slot -> the autograd suffix of eager's text of its tensor

                def note(index: int, value: Any) -> None:
                    suffix = autograd_suffix(value, where)
                    if suffix is not None:
                        suffixes[index] = suffix

                template, slots = template_of((args, kwargs), sources.node_of, what, lambda _: f" at {where}",
                                              opaque=_opaque, note=note)
                real_args, real_kwargs = real_values((args, kwargs))
                sources.pending.append(lambda: original(*real_args, **real_kwargs))

                def replay(values: tuple) -> None:
                    call_args, call_kwargs = filled(template, printed(values, suffixes) if suffixes else values)
                    original(*call_args, **call_kwargs)

                effect_node(sources.graph, what, replay, slots, sources.record())
                return None  # print and Logger._log return nothing

            return echo

        return wrap

    def _filters_mutated(self, original: Callable[[], None]) -> Callable[[], None]:
        sources = self

        @functools.wraps(original)
        def mutated() -> None:
            # Frames: this one, warnings' own (simplefilter, catch_warnings), then who changed them.
            if sources.filters_changed is None and from_user((warnings.__file__,), sources.library):
                sources.filters_changed = sources.source()
            original()

        return mutated

    def filters_refusal(self) -> str | None:
        """Why the capture is refused when the step's own code changed the warning filters
        (``warnings.filterwarnings``, ``simplefilter``, ``catch_warnings``): a replay would not change
        them again, and eager's change makes every registry forget what it showed. None when not."""
        if self.filters_changed is None:
            return None
        return (f"the step changes the warning filters at {self.filters_changed}, which a replayed graph would "
                "not change again")

    def host_call_warned(self, warning: StepWarning) -> None:
        """A warning of a host call the capture call made (a scheduler's ``step``): as ``_warned``, but
        with no node of its own, since each replay's call of it issues what it warns."""
        self._warned(warning, node=False)

    def _warned(self, warning: StepWarning, node: bool = True) -> None:
        """A warning of the step's: an error now, as in eager; else issued when the capture is committed,
        and by a host node on every replay (``step_warnings``). One issued under filters the step
        changed (inside its ``catch_warnings``) is not replayed: ignored there, it is dropped, as eager
        drops it; otherwise the capture is refused."""
        filters, kept, show = self._filters
        if warnings.filters is not filters or tuple(warnings.filters) != kept or warnings.showwarning is not show:
            if warning.ignored():
                return
            raise DataDependentError(f"the step issues a warning at {self.source()} under warning filters it "
                                     "changed (catch_warnings, simplefilter), which a replayed graph would not "
                                     "change again")
        if warning.raises():
            warning.issue()
        self.pending.append(warning.issue)
        self.step_warnings.append(warning)
        if node:
            issuing = effect_node(self.graph, "warnings.warn", lambda values: warning.issue(), [], self.record())
            issuing.meta[SILENT_AGAIN] = warning.silent_again

    def _refuse_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        sources = self

        @functools.wraps(original)
        def refuse_next(iterator: Any, *default: Any) -> Any:
            caller = sys._getframe(1)
            if not sources.library(caller.f_code.co_filename):
                name = _kept_by(iterator, caller)
                if name is not None:  # refused before drawing: the fallback draws this same item
                    raise DataDependentError(f"the step draws the next item of {name} at {sources.source()}, "
                                             "which a replayed graph would not draw again")
            return original(iterator, *default)

        return refuse_next

    def _refuse_draw(self, what: str) -> Callable[[Any], Any]:
        return self._refuse(f"draws a Python random number ({what})", "draw again", (random.__file__,))

    def _anomaly_switch(self, original: Callable[..., None]) -> Callable[..., None]:
        """``torch.set_anomaly_enabled`` refusing the capture when the step's code turns the NaN checks
        on (``with torch.autograd.detect_anomaly():``), before its backward runs: otherwise the refusal
        comes from inside that backward, where anomaly mode adds a warning of its own that eager has not."""
        sources = self

        @functools.wraps(original)
        def switch(mode: bool, check_nan: bool = True) -> None:
            if mode and check_nan and from_user((_ANOMALY_FILE,), sources.library):
                raise DataDependentError(f"{_ANOMALY_CHECKS} (turned on at {sources.source()})")
            original(mode, check_nan)

        return switch

    def _refuse(self, doing: str, undone: str, skip_files: tuple[str, ...] = ()) -> Callable[[Any], Any]:
        """A wrapper that refuses the capture when the user's code calls the function: ``the step
        {doing} at file:line, which a replayed graph would not {undone}``."""
        sources = self

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def refuse(*args: Any, **kwargs: Any) -> Any:
                if from_user(skip_files, sources.library):
                    raise DataDependentError(f"the step {doing} at {sources.source()}, which a replayed graph "
                                             f"would not {undone}")
                return original(*args, **kwargs)

            return refuse

        return wrap
