"""Which calls of a traced function are profiled: torch.profiler's schedule.

``schedule(skip_first, wait, warmup, active, repeat)`` has torch.profiler's
meaning, counted in calls of the traced function (call 0 is the first call):
``skip_first`` calls are skipped, then cycles of ``wait`` idle calls,
``warmup`` calls that run probes and discard them (caches and allocators
settle), and ``active`` recorded calls; the last active call of a cycle ends
it, and its profile is handed to ``on_profile_ready``. ``repeat=0`` repeats
forever. Skipped and waiting calls run the graph without probes.

Calls 0 (eager warm-up) and 1 (capture) cannot carry probes whatever the
schedule says; if they fall in an active window, that cycle has fewer steps
(the profile's step indices show which calls were recorded).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    """What to do on one call."""

    NONE = "none"            # no probes
    WARMUP = "warmup"        # probes, samples discarded
    RECORD = "record"        # probes, samples kept
    RECORD_AND_SAVE = "record_and_save"  # kept, and the cycle is complete


@dataclass(frozen=True)
class Schedule:
    """A profiling schedule; call it with a call index to get that call's Action."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 1
    active: int = 3
    repeat: int = 0

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "active", "repeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"schedule {name} must be a non-negative integer, not {value!r}")
        if self.active < 1:
            raise ValueError("schedule active must be at least 1")

    @property
    def cycle_length(self) -> int:
        return self.wait + self.warmup + self.active

    def __call__(self, call: int) -> Action:
        if call < self.skip_first:
            return Action.NONE
        position = call - self.skip_first
        cycle, offset = divmod(position, self.cycle_length)
        if self.repeat > 0 and cycle >= self.repeat:
            return Action.NONE
        if offset < self.wait:
            return Action.NONE
        if offset < self.wait + self.warmup:
            return Action.WARMUP
        if offset == self.cycle_length - 1:
            return Action.RECORD_AND_SAVE
        return Action.RECORD

    def describe(self) -> str:
        first = self.skip_first + self.wait + self.warmup
        last = first + self.active - 1
        return f"calls {first}-{last} of each cycle of {self.cycle_length} after {self.skip_first} skipped"


def schedule(skip_first: int = 0, wait: int = 0, warmup: int = 1, active: int = 3, repeat: int = 0) -> Schedule:
    """torch.profiler-style schedule, counted in calls of the traced function."""
    return Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
