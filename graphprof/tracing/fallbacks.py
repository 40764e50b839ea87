"""When a traced function stops capturing, and how a call that cannot replay still gives eager's outcome.

Profiling never changes results: where a capture is refused, fails, or keeps
being needed, or where a replay raises, the call must end as eager would and
later calls must run another way (torch.compile segments, or eagerly), said
in one warning. Those decisions, and the counts they rest on (captures in a
row, the step's own errors, refusals by one call's values), live here, apart
from the call path in traced_function.py that asks for them.

The handlers are called directly from ``TracedFunction``'s call path, which
passes itself (the policy keeps no reference to it, so that a traced function
the user drops is freed at once, as before). Their warnings blame the user's
call (capture/caller_warnings.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Hashable, Protocol

from graphprof.capture.caller_warnings import warn_caller
from graphprof.capture.errors import CaptureError
from graphprof.capture.scalars import DataDependentError, Guard
from graphprof.runtime.failed_replays import ReplayError
from graphprof.runtime.runner import Runner
from graphprof.runtime.segmented_runner import SegmentedRunner
from graphprof.tracing.captured_paths import CapturedPaths

log = logging.getLogger("graphprof")

#: Captures in a row (no replay between them) after which the step is profiled as segments.
STORM_LIMIT = 5
#: Captures in a row refused by their call's values alone (gradients that overflowed while a float16
#: run's scale comes down: one per halving) after which the step is profiled as segments.
CALL_ONLY_LIMIT = 16


class FallingBack(Protocol):
    """What the policy needs of the traced function it decides for (``TracedFunction``)."""

    __name__: str
    capture: str
    _fn: Callable[..., Any]
    _paths: CapturedPaths

    def _run(self, runner: Runner, call: int, start: int, args: tuple, kwargs: dict, leaves: list[Any],
             key: Hashable) -> Any: ...

    def _segmented_runner(self) -> SegmentedRunner: ...

    def _segments_note(self) -> str: ...

    def _switch_runner(self, runner: Runner | None) -> None: ...


class FallbackPolicy:
    """The fallback state of one traced function, and what its calls do when capture or replay fails."""

    def __init__(self) -> None:
        self.captures_in_a_row = 0
        #: Of the captures in a row, how many last ones stopped at an error the step raises itself (as
        #: eager does), and the last such error: the storm's warning names that, not a capture's reason.
        self.own_errors_in_a_row: tuple[int, str] = (0, "")
        #: Captures in a row refused by their call's values alone (``after_call_only_refusal``), and why.
        self.call_only_in_a_row: tuple[int, str] = (0, "")
        #: Whether the last capture left a hook registered (``after_hooks_left``) and none was kept since.
        self.hooks_left_once = False
        self.storm: str | None = None  # why re-capturing stopped
        #: Why every call runs as segments (a refused capture with no other path to tell it from).
        self.segments_only: str | None = None
        #: Why every call runs eagerly, unprofiled (``after_hooks_left``).
        self.eager_only: str | None = None

    def clear(self) -> None:
        """Forget every fallback (``TracedFunction.reset``)."""
        self.segments_only = self.eager_only = None
        self.captures_in_a_row = 0
        self.own_errors_in_a_row = (0, "")
        self.call_only_in_a_row = (0, "")
        self.hooks_left_once = False
        self.storm = None

    def whole_step(self, capture: str) -> bool:
        """Whether calls may replay whole-step graphs (not segments, after a storm or by choice); ``capture``
        is the traced function's mode."""
        return self.storm is None and self.segments_only is None and capture != "dynamo"

    def note_storm(self, reason: str, broken: Guard | None) -> None:
        """Decide whether capturing stops before this call's capture (``storm`` says why when it does)."""
        if broken is not None and broken.formats_text:
            # A printed or formatted number that changed is nearly always a counter or a logged value
            # (``print(f"step {self.n}")``): it would change on every call, so no graph would run again.
            self.storm = (f"prints or formats a number that changed between calls ({broken.describe()}), whose "
                          "text a static graph would keep")
        elif self.captures_in_a_row > STORM_LIMIT:
            self.storm = self.storm_reason(reason)
        elif self.call_only_in_a_row[0] >= CALL_ONLY_LIMIT:
            tries, refusal = self.call_only_in_a_row
            self.storm = f"could not be captured {tries} times in a row: each try met {refusal}"

    def storm_reason(self, reason: str) -> str:
        """Why capturing stops after ``captures_in_a_row`` tries, ``reason`` being the last one's. When every
        try stopped at the step's own error (``Adam(capturable=True)`` on CPU raises on every call, as in
        eager), that error: the step never captured, and "because it runs for the first time" misled."""
        tries = self.captures_in_a_row - 1
        errors, error = self.own_errors_in_a_row
        if errors >= tries:
            return (f"could not be captured {tries} times in a row: each try stopped at an error the step raises "
                    f"itself, as it does eagerly ({error})")
        return f"captured {tries} times in a row, the last time because {reason}"

    def after_kept_capture(self) -> None:
        """A capture whose graph is kept ends every run of failed tries."""
        self.own_errors_in_a_row = (0, "")
        self.call_only_in_a_row = (0, "")
        self.hooks_left_once = False

    def after_refused_capture(self, traced: FallingBack, exc: CaptureError, key: Hashable, call: int, start: int,
                              args: tuple, kwargs: dict, leaves: list[Any]) -> Any:
        """A capture the step's Python refused: keep the path it took as one that runs as segments, or run
        every call as segments."""
        kept = exc.refused_path is not None and bool(traced._paths.graphs.get(key)) and traced._paths.keep_refused(
            key, exc.refused_path, f"graphprof: {exc}; profiling the calls of {traced.__name__} that take this "
            "path as torch.compile segments, and replaying the others' graphs", traced._segments_note)
        if not kept:
            self.segments_only = str(exc)
            warn_caller(f"graphprof: {exc}; profiling {traced.__name__} as torch.compile segments instead"
                        f"{traced._segments_note()}")
        return traced._run(traced._segmented_runner(), call, start, args, kwargs, leaves, key)

    def after_call_only_refusal(self, traced: FallingBack, refusal: DataDependentError, args: tuple,
                                kwargs: dict) -> Any:
        """A capture refused by this call's values alone (its gradients overflowed, and the scaler skipped
        the optimizer's step: capture/grad_scaler.py): the call runs eagerly from the state the capture
        put back, and the next call captures again. Such tries are not a storm (a float16 run overflows
        once per halving of its scale at the start); ``CALL_ONLY_LIMIT`` of them in a row are."""
        self.captures_in_a_row = max(0, self.captures_in_a_row - 1)
        self.call_only_in_a_row = (self.call_only_in_a_row[0] + 1, str(refusal))
        return traced._fn(*args, **kwargs)

    def after_hooks_left(self, traced: FallingBack, hooks: str, result: Any) -> Any:
        """A capture call that left a hook registered (capture/registered_hooks.py): it stands (it ran the
        step for real), and its graph is not kept. The first time, it may be a library's one-time install:
        the next call captures again. Twice in a row, with no graph kept between, the step registers one
        on every call: every later call runs eagerly, after one warning. Not as segments: torch.compile
        guards on the hook dicts, and would compile the step's modules again on every call."""
        if not self.hooks_left_once:
            self.hooks_left_once = True
            log.info("graphprof: %s %s; its graph is not kept, and the next call captures again", traced.__name__,
                     hooks)
            return result
        self.eager_only = (f"graphprof: {traced.__name__} {hooks}, on every call it was captured in: eager runs one "
                           "more on every call, where a replayed graph would run the hooks one capture call ran")
        traced._switch_runner(None)  # no runner runs its calls
        if traced.capture == "auto":
            warn_caller(f"{self.eager_only}; it runs eagerly from now on, unprofiled (as torch.compile segments "
                        "it would compile again on every call)")
        return result

    def after_failed_capture(self, traced: FallingBack, exc: CaptureError, args: tuple, kwargs: dict) -> Any:
        """A capture stopped by an error, not by a refusal: run the call eagerly from the state the
        capture put back. Should eager raise too, the error is the step's own (a bad batch, met by
        the call that captures): it reaches the caller as eager raised it, and the next call captures.
        Else the capture failed where eager does not: eager's result, and segments from now on."""
        try:
            result = traced._fn(*args, **kwargs)
        except BaseException as error:
            errors, _ = self.own_errors_in_a_row
            self.own_errors_in_a_row = (errors + 1, f"{type(error).__name__}: {error}".splitlines()[0])
            raise
        self.segments_only = str(exc)
        warn_caller(f"graphprof: {exc}; this call ran eagerly, and later calls of {traced.__name__} run as "
                    f"torch.compile segments{traced._segments_note()}")
        return result

    def after_failed_replay(self, traced: FallingBack, failed: ReplayError, args: tuple, kwargs: dict) -> Any:
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
            result = traced._fn(*args, **kwargs)  # raises eager's own error, as eager would have
            self.segments_only = f"its graph raised {what} where eager did not"
            warn_caller(f"graphprof: the replayed graph of {traced.__name__} raised {what} at {failure.node}, "
                        "where eager did not; this call ran eagerly, and later calls run as torch.compile "
                        f"segments{traced._segments_note()}")
            return result
        self.segments_only = f"a replay raised {what} after it had {failure.written}"
        warn_caller(f"graphprof: the replayed graph of {traced.__name__} raised {what} at "
                    f"{failure.node or 'an op'} after it had {failure.written}, so it cannot run the step again as "
                    "eager would: the error is raised to the caller, and what the step changes before that point "
                    "(Python state, gradients) may differ from what eager leaves (where code the step calls "
                    "catches the error itself, eager went on); later calls run as torch.compile segments, which "
                    f"stop where eager stops{traced._segments_note()}")
        raise error.with_traceback(error.__traceback__)
