"""The profiles of a traced function: one per completed schedule cycle, or the steps recorded last.

Runners only record samples; turning them into a ``Profile`` (with the eager
calls' times for comparison) and choosing which runner's steps
``get_profile`` shows, or why it has none yet, is this module's job. It is
apart from the call path (traced_function.py) because none of it runs while
a step runs, except a cycle that completes.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from graphprof.passes.instrument import Clock
from graphprof.profile.model import Profile
from graphprof.profile.step_facts import with_eager_times
from graphprof.runtime.assemble import assemble_profile
from graphprof.runtime.runner import Runner
from graphprof.runtime.schedule import Schedule
from graphprof.runtime.segmented_runner import SegmentedRunner
from graphprof.tracing.fallbacks import FallbackPolicy


class Profiled(Protocol):
    """What the profiles need of the traced function they belong to (``TracedFunction``): its settings,
    read when a profile is made (the user may change them), and which runners ran its calls."""

    __name__: str
    peaks: dict[str, float] | None
    schedule: Schedule | None
    on_profile_ready: Callable[[Profile], Any] | None
    _clock: Clock
    _calls: int
    _runner: Runner | None
    _profiled: Runner | None
    _fallbacks: FallbackPolicy


class StepProfiles:
    """The completed cycles and eager times of one traced function, and its latest profile. The traced
    function is passed in, not kept: no reference cycle keeps one the user dropped alive."""

    def __init__(self) -> None:
        self.cycles: list[Profile] = []
        #: Calls run eagerly before capture, each timed: the eager step the graph is compared with.
        self.eager_s: list[float] = []

    def clear(self) -> None:
        self.cycles.clear()
        self.eager_s.clear()

    def complete_cycle(self, traced: Profiled, runner: Runner) -> None:
        profile = self.profile_of(traced, runner, cycle=len(self.cycles))
        runner.clear_samples()
        self.cycles.append(profile)
        if traced.on_profile_ready is not None:
            traced.on_profile_ready(profile)

    def profile_of(self, traced: Profiled, runner: Runner, cycle: int | None = None) -> Profile:
        profile = assemble_profile(traced.__name__, runner.recorded_steps(), clock=traced._clock, peaks=traced.peaks,
                                   schedule=traced.schedule, cycle=cycle)
        return with_eager_times(profile, self.eager_s, first_is_cold=True) if self.eager_s else profile  # type: ignore[return-value]  # dataclasses.replace keeps the subclass; typed in profile/

    def latest(self, traced: Profiled, all: bool = False) -> Any:
        """``TracedFunction.get_profile``: the latest profile, or with ``all=True`` every completed cycle."""
        if traced.schedule is not None:
            if not self.cycles:
                raise RuntimeError(
                    f"no profiling cycle of {traced.__name__} has completed yet ({traced._calls} calls so far; "
                    f"the schedule records {traced.schedule.describe()})"
                )
            return list(self.cycles) if all else self.cycles[-1]
        runner = traced._runner
        profiled = traced._profiled
        if (runner is None or not runner.recorded()) and profiled is not None and profiled.recorded():
            runner = profiled
        if isinstance(runner, SegmentedRunner) and not runner.recorded():
            raise RuntimeError(f"no profiled step yet for {traced.__name__} (segmented capture: the first call "
                               "after the eager one compiles, later calls are profiled)")
        storm = traced._fallbacks.storm
        if storm is not None and (runner is None or not runner.recorded()):
            raise RuntimeError(f"no profiled step yet for {traced.__name__}: it {storm}")
        if runner is None or not runner.recorded():
            raise RuntimeError(
                f"no profiled step yet for {traced.__name__}: call 1 runs eagerly, call 2 captures the graph, "
                "(measuring kernel workspace too) and calls from 3 on are profiled (with profiling=True)"
            )
        profile = self.profile_of(traced, runner)
        return [profile] if all else profile
