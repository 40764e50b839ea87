"""``@graphprof.trace``: the policy that decides how each call of a traced function runs.

Call 1 runs the user's function eagerly (lazily created state, such as
optimizer moments, comes into existence). Call 2 captures it with make_fx
while executing it: its result is that step's result. Later calls run the
captured graph through a runner (runtime/whole_step_runner.py), or, when the
step cannot be one static graph, torch.compile segments
(runtime/segmented_runner.py). This module only decides: which runner, what
the schedule asks of the call, when to capture again (a new input signature,
changed optimizer hyperparameters or module modes; bounded by
``cache_size``, like ``torch.compile``'s recompiles), and when to fall back.
Profiles are assembled by runtime/assemble.py.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch
import torch.fx

from graphprof.profile.model import Profile
from graphprof.capture.distributed import OPTIMIZER_ONLY
from graphprof.capture.errors import CaptureError
from graphprof.capture.gradient_hooks import hooks_note
from graphprof.capture.refused_paths import RefusedPath, refused_path
from graphprof.capture.replay_check import Path
from graphprof.capture.scalars import GUARD_SINKS, DataDependentError, Guard
from graphprof.capture.signature import LastSignature, foreign_context, signature, signature_change
from graphprof.capture.captured_step import NEVER_AGAIN, OPTIMIZER_STATE_CREATED
from graphprof.passes.instrument import Clock
from graphprof.profile.step_facts import with_eager_times
from graphprof.runtime.assemble import assemble_profile
from graphprof.runtime.device_clock import TIMINGS, DeviceClock
from graphprof.runtime.failed_replays import ReplayError, overflowed
from graphprof.runtime.runner import Runner
from graphprof.runtime.schedule import Action, Schedule
from graphprof.runtime.segmented_runner import SegmentedRunner
from graphprof.runtime.whole_step_runner import WholeStepRunner

log = logging.getLogger("graphprof")
_CAPTURE_MODES = ("auto", "fx", "dynamo")
#: Without a schedule every call after capture is recorded; only the newest
#: steps are kept so that memory stays bounded on long runs.
DEFAULT_MAX_STEPS = 100


#: Refused paths kept per input signature; one more refusal profiles every call as segments.
REFUSED_PATHS = 4
#: Captures in a row (no replay between them) after which the step is profiled as segments.
STORM_LIMIT = 5
#: Captures in a row refused by their call's values alone (gradients that overflowed while a float16
#: run's scale comes down: one per halving) after which the step is profiled as segments.
CALL_ONLY_LIMIT = 16


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
        #: Per input signature, the graphs of the paths taken so far, each with its baked values.
        self._graphs: OrderedDict[Hashable, list[Path[WholeStepRunner]]] = OrderedDict()
        #: Whole-step captures so far (each path of each signature counts once).
        self.captures = 0
        self._captures_in_a_row = 0
        #: Of the captures in a row, how many last ones stopped at an error the step raises itself (as
        #: eager does), and the last such error: the storm's warning names that, not a capture's reason.
        self._own_errors_in_a_row: tuple[int, str] = (0, "")
        #: Captures in a row refused by their call's values alone (``_after_call_only_refusal``), and why.
        self._call_only_in_a_row: tuple[int, str] = (0, "")
        #: Whether the last capture left a hook registered (``_after_hooks_left``) and none was kept since.
        self._hooks_left_once = False
        self._storm: str | None = None  # why re-capturing stopped
        self._segmented: SegmentedRunner | None = None
        #: Why every call runs as segments (a refused capture with no other path to tell it from).
        self._segments_only: str | None = None
        #: Why every call runs eagerly, unprofiled (``_after_hooks_left``).
        self._eager_only: str | None = None
        self._foreign_warned = False  # whether a call inside a mode of the caller's was warned about
        #: Per input signature, the paths that refused capture after another path was captured: a call
        #: that would take one runs as segments, the others replay (capture/refused_paths.py).
        self._refused: dict[Hashable, list[RefusedPath]] = {}
        self._runner: Runner | None = None  # the runner of the last call
        #: The last runner before ``_runner`` that held recorded steps: what ``get_profile`` shows when the
        #: last call captured a new path (a capture call records no step).
        self._profiled: Runner | None = None
        self._cycles: list[Profile] = []
        #: Calls run eagerly before capture, each timed: the eager step the graph is compared with.
        self.eager_calls = eager_calls
        self._own = frozenset(self.__dict__)  # the wrapper's own attributes; others are the traced callable's
        self._eager_s: list[float] = []
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
        if call < self.eager_calls:
            result = self._fn(*args, **kwargs)
            self._eager_s.append((self._clock() - start) * 1e-9)
            return result
        if self._eager_only is not None:
            if self.capture != "auto":
                raise CaptureError(self._eager_only)
            return self._fn(*args, **kwargs)
        foreign = foreign_context()
        if foreign is not None:  # the caller's mode sees every op eager runs: only eager runs them all
            if not self._foreign_warned:
                self._foreign_warned = True
                warnings.warn(f"graphprof: {self.__name__} is called inside {foreign}, which sees every op the step "
                              "runs and which a replayed graph would not pass its ops through; such calls run "
                              "eagerly, unprofiled", stacklevel=3)
            return self._fn(*args, **kwargs)
        last = self._last_signature
        if last is not None:
            path = last.replay
            if path is not None and self._whole_step() and path.check(args, kwargs):
                # What _select would find (the key's first path, every test passed), in one test.
                self._captures_in_a_row = 0
                return self._run(path.runner, call, start, args, kwargs, list(args), last.key)
        key: Hashable
        if last is not None and last.matches(args, kwargs):
            key, leaves = last.key, list(args)
        else:
            key, leaves = signature(args, kwargs)
            last = self._last_signature = LastSignature.of(key, args, kwargs)
        if not self._whole_step():
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        runner, reason, broken = self._select(key, leaves, last)
        if runner is not None:
            self._captures_in_a_row = 0
            return self._run(runner, call, start, args, kwargs, leaves, key)
        if any(path.taken_by(leaves) for path in self._refused.get(key, ())):
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        if reason != OPTIMIZER_STATE_CREATED:  # happens once per optimizer: not a storm
            self._captures_in_a_row += 1
        if broken is not None and broken.formats_text and self._refuse_text_path(key, broken, last):
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        if broken is not None and broken.formats_text:
            # A printed or formatted number that changed is nearly always a counter or a logged value
            # (``print(f"step {self.n}")``): it would change on every call, so no graph would run again.
            self._storm = (f"prints or formats a number that changed between calls ({broken.describe()}), whose "
                           "text a static graph would keep")
        elif self._captures_in_a_row > STORM_LIMIT:
            self._storm = self._storm_reason(reason)
        elif self._call_only_in_a_row[0] >= CALL_ONLY_LIMIT:
            tries, refusal = self._call_only_in_a_row
            self._storm = f"could not be captured {tries} times in a row: each try met {refusal}"
        if self._storm is not None:
            message = f"graphprof: {self.__name__} {self._storm}; no longer capturing it"
            if self.capture != "auto":
                raise CaptureError(message)
            warnings.warn(f"{message}, profiling it as torch.compile segments instead{self._segments_note()}",
                          stacklevel=2)
            return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)
        try:
            captured = self._capture(key, args, kwargs, reason)
        except CaptureError as exc:
            if isinstance(exc.__cause__, DataDependentError) and exc.__cause__.this_call_only:
                return self._after_call_only_refusal(exc.__cause__, args, kwargs)
            if self.capture != "auto":
                raise
            if isinstance(exc.__cause__, DataDependentError):
                return self._after_refused_capture(exc, key, call, start, args, kwargs, leaves)
            stopped = exc
        else:
            if captured.captured.hooks_left is not None:
                return self._after_hooks_left(captured.captured.hooks_left, captured.captured.result)
            self._switch_runner(captured)
            self._own_errors_in_a_row = (0, "")
            self._call_only_in_a_row = (0, "")
            self._hooks_left_once = False
            return captured.captured.result
        return self._after_failed_capture(stopped, args, kwargs)  # outside the handler: no chained error

    def _storm_reason(self, reason: str) -> str:
        """Why capturing stops after ``_captures_in_a_row`` tries, ``reason`` being the last one's. When every
        try stopped at the step's own error (``Adam(capturable=True)`` on CPU raises on every call, as in
        eager), that error: the step never captured, and "because it runs for the first time" misled."""
        tries = self._captures_in_a_row - 1
        errors, error = self._own_errors_in_a_row
        if errors >= tries:
            return (f"could not be captured {tries} times in a row: each try stopped at an error the step raises "
                    f"itself, as it does eagerly ({error})")
        return f"captured {tries} times in a row, the last time because {reason}"

    def _switch_runner(self, runner: Runner | None) -> None:
        """Make ``runner`` the last call's, keeping the one before when it holds recorded steps."""
        previous = self._runner
        if previous is not None and previous.recorded():
            self._profiled = previous
        self._runner = runner

    def _after_refused_capture(self, exc: CaptureError, key: Hashable, call: int, start: int, args: tuple,
                               kwargs: dict, leaves: list[Any]) -> Any:
        """A capture the step's Python refused: keep the path it took as one that runs as segments, or run
        every call as segments."""
        kept = exc.refused_path is not None and bool(self._graphs.get(key)) and self._keep_refused(
            key, exc.refused_path, f"graphprof: {exc}; profiling the calls of {self.__name__} that take this "
            "path as torch.compile segments, and replaying the others' graphs")
        if not kept:
            self._segments_only = str(exc)
            warnings.warn(f"graphprof: {exc}; profiling {self.__name__} as torch.compile segments instead"
                          f"{self._segments_note()}",
                          stacklevel=3)
        return self._run(self._segmented_runner(), call, start, args, kwargs, leaves, key)

    def _after_call_only_refusal(self, refusal: DataDependentError, args: tuple, kwargs: dict) -> Any:
        """A capture refused by this call's values alone (its gradients overflowed, and the scaler skipped
        the optimizer's step: capture/grad_scaler.py): the call runs eagerly from the state the capture
        put back, and the next call captures again. Such tries are not a storm (a float16 run overflows
        once per halving of its scale at the start); ``CALL_ONLY_LIMIT`` of them in a row are."""
        self._captures_in_a_row = max(0, self._captures_in_a_row - 1)
        self._call_only_in_a_row = (self._call_only_in_a_row[0] + 1, str(refusal))
        return self._fn(*args, **kwargs)

    def _after_hooks_left(self, hooks: str, result: Any) -> Any:
        """A capture call that left a hook registered (capture/registered_hooks.py): it stands (it ran the
        step for real), and its graph is not kept. The first time, it may be a library's one-time install:
        the next call captures again. Twice in a row, with no graph kept between, the step registers one
        on every call: every later call runs eagerly, after one warning. Not as segments: torch.compile
        guards on the hook dicts, and would compile the step's modules again on every call."""
        if not self._hooks_left_once:
            self._hooks_left_once = True
            log.info("graphprof: %s %s; its graph is not kept, and the next call captures again", self.__name__, hooks)
            return result
        self._eager_only = (f"graphprof: {self.__name__} {hooks}, on every call it was captured in: eager runs one "
                            "more on every call, where a replayed graph would run the hooks one capture call ran")
        self._switch_runner(None)  # no runner runs its calls
        if self.capture == "auto":
            warnings.warn(f"{self._eager_only}; it runs eagerly from now on, unprofiled (as torch.compile segments "
                          "it would compile again on every call)", stacklevel=4)
        return result

    def _refuse_text_path(self, key: Hashable, broken: Guard, last: LastSignature | None) -> bool:
        """Turn the path whose formatted text ``broken`` changed into a refused path, when the step has
        another path to replay (``if n % 10 == 0: print(f"step {n}")``: the logging calls go to
        segments, the others keep their graph); False when it has none (then every call is segments).
        """
        paths = self._graphs.get(key) or []
        path = next((p for p in paths if any(g is broken for g in p.runner.captured.guards)), None)
        if path is None or len(paths) < 2:
            return False
        captured = path.runner.captured
        kept = refused_path(captured.guards, captured.scalar_positions)
        if kept is None or not self._keep_refused(
                key, kept, f"graphprof: {self.__name__} prints or formats a number that changed between calls "
                f"({broken.describe()}), whose text a static graph would keep; profiling the calls that take this "
                "path as torch.compile segments, and replaying the others' graphs"):
            return False
        paths.remove(path)
        if last is not None and last.replay is path:
            last.replay = None
        return True

    def _keep_refused(self, key: Hashable, path: RefusedPath, message: str) -> bool:
        """Keep ``path`` among ``key``'s refused paths, unless ``REFUSED_PATHS`` are kept already (False).
        One warning for the step's first refused path; later ones (the same logging code met with and
        without padding, say) are logged, since they say nothing new."""
        refused = self._refused.setdefault(key, [])
        if len(refused) >= REFUSED_PATHS:
            return False
        refused.append(path)
        if sum(map(len, self._refused.values())) > 1:
            log.info(message)
        else:
            warnings.warn(message + self._segments_note(), stacklevel=3)
        return True

    def _select(self, key: Hashable, leaves: list[Any],
                last: LastSignature | None) -> tuple[WholeStepRunner | None, str, Guard | None]:
        """The captured path this call takes, or why none fits (a new signature, a guard, a baked value)
        and, when the last path tried failed a guard, that guard.

        ``last`` is the record of this call's key when it has one: it keeps the
        key's paths between calls (``_capture`` and ``reset`` drop them), and the
        first path, once taken, for the next call to try by its check alone.
        """
        if last is not None and last.paths is not None:
            paths = last.paths
        else:
            paths = self._graphs.get(key)
            if last is not None:
                last.paths = paths
        if not paths:
            if not self._graphs:
                return None, "it runs for the first time", None
            return None, signature_change(next(reversed(self._graphs)), key), None
        reason = ""
        broken: Guard | None = None
        for path in list(paths):
            runner = path.runner
            changed = path.baked.changed()
            if changed is not None:  # kept: a loop that switches train/eval modes comes back to it
                reason, broken = changed, None
                continue
            mismatch = runner.captured.entry_mismatch()
            if mismatch is not None:
                reason, broken = mismatch, None
                if mismatch in NEVER_AGAIN:  # it never goes away: neither will this graph run
                    paths.remove(path)
                    if last is not None:
                        last.replay = None
                continue
            broken = runner.captured.broken_guard(leaves)
            if broken is None:
                if last is not None and path is paths[0] and path.check is not None:
                    last.replay = path  # the next call of this key tries its check first
                return runner, "", None
            reason = broken.broken_reason()
        return None, reason or "its input signature is new", broken

    def _whole_step(self) -> bool:
        """Whether calls may replay whole-step graphs (not segments, after a storm or by choice)."""
        return self._storm is None and self._segments_only is None and self.capture != "dynamo"

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
                return self._after_failed_replay(failed, args, kwargs)
            if failed is not None:  # its gradients overflowed, before it changed anything (capture/grad_scaler.py)
                failed.failure.restore()
                result = self._fn(*args, **kwargs)  # eager's skipped step; later calls replay again
        if action is Action.RECORD_AND_SAVE and runner.recorded():
            self._complete_cycle(runner)
        return result

    def _after_failed_capture(self, exc: CaptureError, args: tuple, kwargs: dict) -> Any:
        """A capture stopped by an error, not by a refusal: run the call eagerly from the state the
        capture put back. Should eager raise too, the error is the step's own (a bad batch, met by
        the call that captures): it reaches the caller as eager raised it, and the next call captures.
        Else the capture failed where eager does not: eager's result, and segments from now on."""
        try:
            result = self._fn(*args, **kwargs)
        except BaseException as error:
            errors, _ = self._own_errors_in_a_row
            self._own_errors_in_a_row = (errors + 1, f"{type(error).__name__}: {error}".splitlines()[0])
            raise
        self._segments_only = str(exc)
        warnings.warn(f"graphprof: {exc}; this call ran eagerly, and later calls of {self.__name__} run as "
                      f"torch.compile segments{self._segments_note()}", stacklevel=4)
        return result

    def _after_failed_replay(self, failed: ReplayError, args: tuple, kwargs: dict) -> Any:
        """Give the caller eager's outcome of a call whose replay raised (runtime/failed_replays.py).

        When the replay changed nothing the user holds before it stopped, the
        step runs again eagerly from that state: eager's error, with eager's
        traceback and everything eager did before it. Should eager not raise,
        the replay raised where eager does not: its result is returned, and the
        step is not replayed again. When the replay had changed state, what
        eager leaves cannot be given: the error is raised after one warning,
        and later calls run as segments, which stop where eager stops.
        """
        failure, error = failed.failure, failed.error
        what = f"{type(error).__name__}: {error}".splitlines()[0]
        if failure.written is None:
            failure.restore()
            result = self._fn(*args, **kwargs)  # raises eager's own error, as eager would have
            self._segments_only = f"its graph raised {what} where eager did not"
            warnings.warn(f"graphprof: the replayed graph of {self.__name__} raised {what} at {failure.node}, "
                          "where eager did not; this call ran eagerly, and later calls run as torch.compile "
                          f"segments{self._segments_note()}", stacklevel=5)
            return result
        self._segments_only = f"a replay raised {what} after it had {failure.written}"
        warnings.warn(f"graphprof: the replayed graph of {self.__name__} raised {what} at {failure.node or 'an op'} "
                      f"after it had {failure.written}, so it cannot run the step again as eager would: the error "
                      "is raised to the caller, and what the step changes before that point (Python state, "
                      "gradients) may differ from what eager leaves (where code the step calls catches the error "
                      "itself, eager went on); later calls run as torch.compile segments, which stop where eager "
                      f"stops{self._segments_note()}", stacklevel=5)
        raise error.with_traceback(error.__traceback__)

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

    def _optimizer_graph(self, opt: torch.optim.Optimizer, model: torch.nn.Module | None) -> "OptimizerGraph":
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
        if self._graphs:
            log.info("graphprof: %s: capturing again because %s", self.__name__, reason)
        if self._last_signature is not None:  # the graphs change: looked up again on the next call
            self._last_signature.paths = self._last_signature.replay = None
        runner = WholeStepRunner.capture(
            self.__name__, self._fn, args, kwargs, clock=self._clock, limit=self._limit,
            profiling=self.profiling, sample_rate=self.sample_rate,
            timing=self.timing, device_clock=self._device_clock)
        self.captures += 1
        if runner.captured.hooks_left is not None:  # not kept (``_after_hooks_left``)
            return runner
        paths = self._graphs.setdefault(key, [])
        paths.append(Path.of(runner, runner.captured, self._last_signature))  # the record of this call's key
        self._graphs.move_to_end(key)
        while len(paths) > self.cache_size:
            paths.pop(0)
        while len(self._graphs) > self.cache_size:
            self._graphs.popitem(last=False)
        return runner

    def _complete_cycle(self, runner: Runner) -> None:
        profile = self._profile_of(runner, cycle=len(self._cycles))
        runner.clear_samples()
        self._cycles.append(profile)
        if self.on_profile_ready is not None:
            self.on_profile_ready(profile)

    def _profile_of(self, runner: Runner, cycle: int | None = None) -> Profile:
        profile = assemble_profile(self.__name__, runner.recorded_steps(), clock=self._clock, peaks=self.peaks,
                                   schedule=self.schedule, cycle=cycle)
        return with_eager_times(profile, self._eager_s, first_is_cold=True) if self._eager_s else profile  # type: ignore[return-value]  # dataclasses.replace keeps the subclass; typed in profile/

    # -- results ------------------------------------------------------------------
    def get_profile(self, all: bool = False) -> Any:
        """The latest profile; with ``all=True`` a list of every completed cycle.

        With a schedule, the latest profile is that of the last completed
        cycle. Without one, it covers the steps recorded on the graph run
        last (at most ``max_steps``, newest kept); when the last call captured
        a new path or compiled its segments, which records no step, on the
        graph run last before it that recorded any.
        """
        if self.schedule is not None:
            if not self._cycles:
                raise RuntimeError(
                    f"no profiling cycle of {self.__name__} has completed yet ({self._calls} calls so far; "
                    f"the schedule records {self.schedule.describe()})"
                )
            return list(self._cycles) if all else self._cycles[-1]
        runner = self._runner
        if (runner is None or not runner.recorded()) and self._profiled is not None and self._profiled.recorded():
            runner = self._profiled
        if isinstance(runner, SegmentedRunner) and not runner.recorded():
            raise RuntimeError(f"no profiled step yet for {self.__name__} (segmented capture: the first call "
                               "after the eager one compiles, later calls are profiled)")
        if self._storm is not None and (runner is None or not runner.recorded()):
            raise RuntimeError(f"no profiled step yet for {self.__name__}: it {self._storm}")
        if runner is None or not runner.recorded():
            raise RuntimeError(
                f"no profiled step yet for {self.__name__}: call 1 runs eagerly, call 2 captures the graph, "
                "(measuring kernel workspace too) and calls from 3 on are profiled (with profiling=True)"
            )
        profile = self._profile_of(runner)
        return [profile] if all else profile

    def reset(self) -> None:
        """Forget captured graphs and samples; the next call runs eagerly again."""
        self._graphs.clear()
        self._runner = self._profiled = None
        self._calls = 0
        self._cycles.clear()
        self._eager_s.clear()
        self._segmented = None
        self._segments_only = self._eager_only = None
        self._refused.clear()
        self.captures = 0
        self._captures_in_a_row = 0
        self._own_errors_in_a_row = (0, "")
        self._call_only_in_a_row = (0, "")
        self._hooks_left_once = False
        self._storm = None
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


class OptimizerGraph:
    """An optimizer's step under segmented capture: its whole-step graph, or eager when it cannot be one.

    Only the last sample is read (the segmented step keeps the stamps), so the
    traced step keeps at most one.
    """

    def __init__(self, traced: TracedFunction, step: Callable[..., Any], warn: bool = True) -> None:
        self.traced = traced
        self.step = step
        self.eager = False
        self.warn = warn

    @property
    def captures(self) -> int:
        return self.traced.captures

    @property
    def profiling(self) -> bool:
        return self.traced.profiling

    @profiling.setter
    def profiling(self, value: bool) -> None:
        self.traced.profiling = value

    def last_sample(self) -> tuple[tuple[int, ...], torch.fx.GraphModule] | None:
        """The stamps of the last call and their graph, when that call was a profiled replay."""
        runner = self.traced.runner
        if self.eager or not isinstance(runner, WholeStepRunner) or not runner.samples.steps:
            return None
        last = runner.samples.steps[-1]
        if last.index != self.traced._calls - 1:
            return None
        return last.stamps_ns, runner.graph_module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager:
            return self.step(*args, **kwargs)
        try:
            return self.traced(*args, **kwargs)
        except CaptureError as exc:
            # Warned only where the step did not warn already (segments the user asked for): after the
            # step's own fallback warning, a second one for the same reason (LBFGS's closure refuses
            # both) broke the one-warning promise, so it is logged.
            self.eager = True
            message = f"graphprof: {exc}; running {self.traced.__name__} eagerly (timed as one host node)"
            if self.warn:
                warnings.warn(message, stacklevel=2)
            else:
                log.info(message)
            return self.step(*args, **kwargs)


def trace(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Capture ``fn`` as a static graph and profile every node.

    Usable as ``@trace``, ``@trace(profiling=True)`` and ``trace(fn, ...)``;
    ``options`` are TracedFunction's keyword arguments.
    """
    def wrap(f: Callable[..., Any]) -> TracedFunction:
        return TracedFunction(f, **options)

    return wrap(fn) if fn is not None else wrap
