"""``@graphprof.trace`` and the traced function's call path: how each call runs.

Call 1 runs the user's function eagerly (lazily created state, such as
optimizer moments, comes into existence). Call 2 captures it with make_fx
while executing it: its result is that step's result. Later calls run the
captured graph through a runner (runtime/whole_step_runner.py), or, when the
step cannot be one static graph, torch.compile segments
(runtime/segmented_runner.py). This module walks one call through those
choices and what the schedule asks of it; which captured path a call takes
is captured_paths.py's, when and how to fall back is fallbacks.py's, and the
profiles are profiles.py's. The traced function's attributes stay the
user's callable's, read and written through it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
from typing import Any, Callable, Hashable

import torch
import torch.fx

from graphprof.capture.caller_warnings import warn_caller
from graphprof.profile.model import Profile
from graphprof.capture.distributed import OPTIMIZER_ONLY
from graphprof.capture.errors import CaptureError
from graphprof.capture.gradient_hooks import hooks_note
from graphprof.capture.scalars import GUARD_SINKS, DataDependentError
from graphprof.capture.signature import LastSignature, foreign_context, signature
from graphprof.capture.captured_step import OPTIMIZER_STATE_CREATED
from graphprof.passes.instrument import Clock
from graphprof.runtime.device_clock import TIMINGS, DeviceClock
from graphprof.runtime.failed_replays import ReplayError, overflowed
from graphprof.runtime.runner import Runner
from graphprof.runtime.schedule import Action, Schedule
from graphprof.runtime.segmented_runner import SegmentedRunner
from graphprof.runtime.whole_step_runner import WholeStepRunner
from graphprof.tracing.captured_paths import CapturedPaths
from graphprof.tracing.fallbacks import FallbackPolicy
from graphprof.tracing.optimizer_graph import OptimizerGraph
from graphprof.tracing.profiles import StepProfiles

log = logging.getLogger("graphprof")
_CAPTURE_MODES = ("auto", "fx", "dynamo")
#: Without a schedule every call after capture is recorded; only the newest
#: steps are kept so that memory stays bounded on long runs.
DEFAULT_MAX_STEPS = 100


class _Outer(threading.local):
    """Whether this thread is inside a traced function's call (``calls``: 0 or 1)."""

    calls = 0


_OUTER = _Outer()


class TracedFunction:
    """A user function replaced by its captured, optionally instrumented, graph."""

    def __getattr__(self, name: str) -> Any:
        """An attribute of the traced callable (``trainer.n`` of a traced trainer object, a module's
        ``training``), read from it now.

        Why not ``update_wrapper``'s copy of its ``__dict__``: the copy kept the
        values of the moment it was traced, so ``traced.n`` stayed 0 while the
        object's counter counted, and ``traced.training`` stayed True after
        ``model.eval()``.
        """
        fn = self.__dict__.get("_fn")
        if fn is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(fn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """An attribute of the traced callable (``traced.scale = 0.5``), written on it, where its step reads
        it: the wrapper's own attributes (those it sets up, and private names) stay the wrapper's."""
        own = self.__dict__.get("_own")  # (None while ``__init__`` sets the wrapper up)
        if name[:1] == "_" or own is None or name in own:
            object.__setattr__(self, name, value)
        else:
            setattr(self._fn, name, value)

    def __init__(self, fn: Callable[..., Any], *, profiling: bool = True, capture: str = "auto",
                 cache_size: int = 8, clock: Clock = time.perf_counter_ns,
                 schedule: Schedule | None = None,
                 on_profile_ready: Callable[[Profile], Any] | None = None,
                 max_steps: int = DEFAULT_MAX_STEPS, sample_rate: int = 0,
                 peaks: dict[str, float] | None = None, timing: str = "pipelined",
                 device_clock: DeviceClock | None = None, eager_calls: int = 1) -> None:
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
        if sample_rate < 0:
            raise ValueError("sample_rate must be 0 (no allocator samples) or a positive number of ops")
        if peaks is not None and not {"flops_per_s", "bytes_per_s"} <= set(peaks):
            raise ValueError("peaks needs 'flops_per_s' and 'bytes_per_s' (optionally 'flops_per_s_<dtype>')")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError("schedule must come from graphprof.schedule(...)")
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if capture not in _CAPTURE_MODES:
            raise ValueError(f"capture must be one of {', '.join(_CAPTURE_MODES)}, not {capture!r}")
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        if eager_calls < 1:
            raise ValueError("eager_calls must be at least 1 (the first call always runs eagerly)")
        # The name, docstring and ``__wrapped__``; not a copy of ``fn``'s ``__dict__``: its attributes are
        # read from ``fn`` itself (``__getattr__``), as they are now, not as they were when it was traced.
        functools.update_wrapper(self, fn, updated=())
        if not hasattr(self, "__name__"):  # a module or other callable object
            self.__name__ = type(fn).__name__
        self._fn = fn
        self.profiling = profiling
        self.capture = capture
        self.cache_size = cache_size
        # Device events on an accelerator: one synchronisation per step ("pipelined") or after
        # every op ("isolated"); ``device_clock`` replaces the real device (tests pass a fake).
        self.timing = timing
        self._device_clock = device_clock
        self.sample_rate = sample_rate
        # Peaks for the roofline: given by hand, else the cached `graphprof calibrate` result.
        self.peaks = dict(peaks) if peaks is not None else None
        self.schedule = schedule
        self.on_profile_ready = on_profile_ready
        self.max_steps = max_steps
        self._clock = clock
        self._calls = 0
        #: The captured paths per input signature, and the paths refused after one was captured.
        self._paths = CapturedPaths()
        #: Whole-step captures so far (each path of each signature counts once).
        self.captures = 0
        #: Why and when calls stop capturing, and what a call that cannot replay does instead.
        self._fallbacks = FallbackPolicy()
        self._segmented: SegmentedRunner | None = None
        self._foreign_warned = False  # whether a call inside a mode of the caller's was warned about
        self._runner: Runner | None = None  # the runner of the last call
        #: The last runner before ``_runner`` that held recorded steps: what ``get_profile`` shows when the
        #: last call captured a new path (a capture call records no step).
        self._profiled: Runner | None = None
        #: The completed cycles' profiles and the eager calls' times.
        self._profiles = StepProfiles()
        #: Calls run eagerly before capture, each timed: the eager step the graph is compared with.
        self.eager_calls = eager_calls
        self._own = frozenset(self.__dict__)  # the wrapper's own attributes; others are the traced callable's
        #: The key of the last call of positional tensors: a call with equal ones reuses it.
        self._last_signature: LastSignature | None = None

    def _action(self, call: int) -> Action:
        if not self.profiling:
            return Action.NONE
        if self.schedule is None:
            return Action.RECORD
        return self.schedule(call)

    @property
    def _limit(self) -> int | None:
        return None if self.schedule is not None else self.max_steps

    # -- calling ----------------------------------------------------------------
    #: Set on graphprof's own traced functions that run inside another's call by design (a segmented
    #: step's optimizer graph): they capture and replay there as usual.
    _part_of_another = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._part_of_another:
            if GUARD_SINKS:  # called while another graph of the step is captured (a wrapper optimizer's
                return self._fn(*args, **kwargs)  # step calls the one it wraps): its ops are that graph's
            return self._call(*args, **kwargs)
        if torch.compiler.is_compiling() or _OUTER.calls:
            # Called from inside another traced function's call: its ops are that call's, captured or
            # compiled with it. Profiled here too, it hung (a compile inside the other's compile) or
            # crashed dynamo, which traced into graphprof's own machinery.
            return self._fn(*args, **kwargs)
        _OUTER.calls = 1
        try:
            return self._call(*args, **kwargs)
        finally:
            _OUTER.calls = 0

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        start = self._clock()
        call = self._calls
        self._calls += 1
        fallbacks = self._fallbacks
        if call < self.eager_calls:
            result = self._fn(*args, **kwargs)
            self._profiles.eager_s.append((self._clock() - start) * 1e-9)
            return result
        if fallbacks.eager_only is not None:
            if self.capture != "auto":
                raise CaptureError(fallbacks.eager_only)
            return self._fn(*args, **kwargs)
        foreign = foreign_context()
        if foreign is not None:  # the caller's mode sees every op eager runs: only eager runs them all
            if not self._foreign_warned:
                self._foreign_warned = True
                warn_caller(f"graphprof: {self.__name__} is called inside {foreign}, which sees every op the step "
                            "runs and which a replayed graph would not pass its ops through; such calls run "
                            "eagerly, unprofiled")
            return self._fn(*args, **kwargs)
        last = self._last_signature
        if last is not None:
            path = last.replay
            if path is not None and fallbacks.whole_step(self.capture) and path.check(args, kwargs):
                # What CapturedPaths.select would find (the key's first path, every test passed), in one test.
                fallbacks.captures_in_a_row = 0
                return self._run(path.runner, call, start, args, kwargs, list(args), last.key)
        key: Hashable
        if last is not None and last.matches(args, kwargs):
            key, leaves = last.key, list(args)
        else:
            key, leaves = signature(args, kwargs)
            last = self._last_signature = LastSignature.of(key, args, kwargs)
        if not fallbacks.whole_step(self.capture):
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        runner, reason, broken = self._paths.select(key, leaves, last)
        if runner is not None:
            fallbacks.captures_in_a_row = 0
            return self._run(runner, call, start, args, kwargs, leaves, key)
        if self._paths.takes_refused(key, leaves):
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        if reason != OPTIMIZER_STATE_CREATED:  # happens once per optimizer: not a storm
            fallbacks.captures_in_a_row += 1
        if broken is not None and broken.formats_text and self._paths.refuse_text_path(
                key, broken, last, self.__name__, self._segments_note):
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        fallbacks.note_storm(reason, broken)
        if fallbacks.storm is not None:
            message = f"graphprof: {self.__name__} {fallbacks.storm}; no longer capturing it"
            if self.capture != "auto":
                raise CaptureError(message)
            warn_caller(f"{message}, profiling it as torch.compile segments instead{self._segments_note()}")
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        try:
            captured = self._capture(key, args, kwargs, reason)
        except CaptureError as exc:
            if isinstance(exc.__cause__, DataDependentError) and exc.__cause__.this_call_only:
                return fallbacks.after_call_only_refusal(self, exc.__cause__, args, kwargs)
            if self.capture != "auto":
                raise
            if isinstance(exc.__cause__, DataDependentError):
                return fallbacks.after_refused_capture(self, exc, key, call, start, args, kwargs, leaves)
            stopped = exc
        else:
            if captured.captured.hooks_left is not None:
                return fallbacks.after_hooks_left(self, captured.captured.hooks_left, captured.captured.result)
            self._switch_runner(captured)
            fallbacks.after_kept_capture()
            return captured.captured.result
        return fallbacks.after_failed_capture(self, stopped, args, kwargs)  # outside the handler: no chained error

    def _switch_runner(self, runner: Runner | None) -> None:
        """Make ``runner`` the last call's, keeping the one before when it holds recorded steps."""
        previous = self._runner
        if previous is not None and previous.recorded():
            self._profiled = previous
        self._runner = runner

    def _run(self, runner: Runner, call: int, start: int, args: tuple, kwargs: dict, leaves: list[Any],
             key: Hashable) -> Any:
        if runner is not self._runner:
            self._switch_runner(runner)
        action = self._action(call)
        if isinstance(runner, SegmentedRunner):
            result = runner.run(call, start, action, args, kwargs, leaves, key)
        elif isinstance(runner, WholeStepRunner) and runner.captured.step_warnings and runner.captured.raises_a_warning():
            # A filter turned to "error" since the capture: eager raises at the warning, after what it
            # ran before it (an update, gradients kept). This call runs eagerly, unprofiled.
            return self._fn(*args, **kwargs)
        else:
            failed = None
            try:
                result = runner.run(call, start, action, args, kwargs, leaves)
            except ReplayError as exc:
                failed = exc
            if failed is not None and not overflowed(failed):  # outside the handler: eager's error is not chained
                return self._fallbacks.after_failed_replay(self, failed, args, kwargs)
            if failed is not None:  # its gradients overflowed, before it changed anything (capture/grad_scaler.py)
                failed.failure.restore()
                result = self._fn(*args, **kwargs)  # eager's skipped step; later calls replay again
        if action is Action.RECORD_AND_SAVE and runner.recorded():
            self._profiles.complete_cycle(self, runner)
        return result

    def _segmented_runner(self) -> SegmentedRunner:
        if self._segmented is None:
            # In "auto" mode segments run only after the step warned why: later recompiles are logged.
            self._segmented = SegmentedRunner(self.__name__, self._fn, self._clock, self._limit, self.cache_size,
                                              self._optimizer_graph, warned=self.capture == "auto")
        return self._segmented

    def _segments_note(self) -> str:
        """What a warning that the step falls back to segments adds where segments run it eagerly while
        its parameters' gradient hooks are registered (capture/gradient_hooks.py), or ""."""
        return hooks_note(self._segmented_runner().capture.gradient_hooks.hooked())

    def _optimizer_graph(self, opt: torch.optim.Optimizer, model: torch.nn.Module | None) -> OptimizerGraph:
        """``opt.step`` as a whole-step graph of its own, for a segmented step (capture/segmented.py says why)."""
        step = types.MethodType(type(opt).step, opt)  # the class's step with its hooks, not the routed one

        def optimizer_step(*args: Any, **kwargs: Any) -> Any:
            _ = (model, opt)  # in the closure so that discovery names parameters after the model
            return step(*args, **kwargs)

        optimizer_step.__qualname__ = optimizer_step.__name__ = f"{type(opt).__name__}.step"
        setattr(optimizer_step, OPTIMIZER_ONLY, True)  # it names the model, it does not run it
        traced = TracedFunction(optimizer_step, capture="fx", clock=self._clock, cache_size=self.cache_size,
                                max_steps=1)
        traced._part_of_another = True
        traced._calls = 1  # the step's eager call already created the optimizer's state: capture at once
        # In "auto" mode segments run only after the step warned why: the optimizer's own fallback is logged.
        return OptimizerGraph(traced, step, warn=self.capture != "auto")

    def _capture(self, key: Hashable, args: tuple, kwargs: dict, reason: str) -> WholeStepRunner:
        if self._paths.graphs:
            log.info("graphprof: %s: capturing again because %s", self.__name__, reason)
        if self._last_signature is not None:  # the graphs change: looked up again on the next call
            self._last_signature.paths = self._last_signature.replay = None
        runner = WholeStepRunner.capture(
            self.__name__, self._fn, args, kwargs, clock=self._clock, limit=self._limit,
            profiling=self.profiling, sample_rate=self.sample_rate,
            timing=self.timing, device_clock=self._device_clock)
        self.captures += 1
        if runner.captured.hooks_left is not None:  # not kept (``FallbackPolicy.after_hooks_left``)
            return runner
        self._paths.keep(key, runner, self._last_signature, self.cache_size)
        return runner

    # -- results ------------------------------------------------------------------
    def get_profile(self, all: bool = False) -> Any:
        """The latest profile; with ``all=True`` a list of every completed cycle.

        With a schedule, the latest profile is that of the last completed
        cycle. Without one, it covers the steps recorded on the graph run
        last (at most ``max_steps``, newest kept); when the last call captured
        a new path or compiled its segments, which records no step, on the
        graph run last before it that recorded any.
        """
        return self._profiles.latest(self, all)

    def reset(self) -> None:
        """Forget captured graphs and samples; the next call runs eagerly again."""
        self._paths.clear()
        self._runner = self._profiled = None
        self._calls = 0
        self._profiles.clear()
        self._segmented = None
        self.captures = 0
        self._fallbacks.clear()
        self._last_signature = None

    @property
    def capture_mode(self) -> str | None:
        """How the last call ran: "whole-step", "segments", or None before any replay and once every call
        runs eagerly (a step registering hooks on every call)."""
        if isinstance(self._runner, WholeStepRunner):
            return "whole-step"
        return "segments" if isinstance(self._runner, SegmentedRunner) else None

    @property
    def runner(self) -> Runner | None:
        """The runner of the last call (a WholeStepRunner or a SegmentedRunner), for inspection."""
        return self._runner

    @property
    def graph_module(self) -> torch.fx.GraphModule | None:
        """The captured (uninstrumented) graph of the last call, for inspection."""
        return self._runner.graph_module if isinstance(self._runner, WholeStepRunner) else None


def trace(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Capture ``fn`` as a static graph and profile every node.

    Usable as ``@trace``, ``@trace(profiling=True)`` and ``trace(fn, ...)``;
    ``options`` are TracedFunction's keyword arguments.
    """
    def wrap(f: Callable[..., Any]) -> TracedFunction:
        return TracedFunction(f, **options)

    return wrap(fn) if fn is not None else wrap
