"""Raw per-step samples, as the instrumented graph returns them.

A step's samples are the host-clock stamps of its probes plus the wall time
of the whole call. They are kept raw (ints, nanoseconds) and turned into
seconds only when a Profile is built: per step, bookkeeping is one append.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar


@dataclass(frozen=True)
class StepSamples:
    """One profiled step: its call index, wall time and the probes' stamps."""

    index: int
    wall_ns: int
    stamps_ns: tuple[int, ...]
    #: Clock readings before the old ``.grad``s are dropped and after the new ones
    #: are assigned, around the graph; (0, 0) when not measured.
    host_ns: tuple[int, int] = (0, 0)

    def host_times_ns(self) -> tuple[int, int]:
        """Time dropping old gradients (to the first probe) and assigning new ones (from the last)."""
        if not self.stamps_ns or self.host_ns == (0, 0):
            return (0, 0)
        return (self.stamps_ns[0] - self.host_ns[0], self.host_ns[1] - self.stamps_ns[-1])

    def overhead_ns(self) -> int:
        """graphprof's own time in the call: from its start to dropping the old gradients, and
        from assigning the new ones to its end (signature, guards, pytree, the samples).

        With the graph's nodes and the two gradient records it adds up to ``wall_ns``
        exactly; 0 when the gradient readings were not taken.
        """
        if self.host_ns == (0, 0):
            return 0
        return self.wall_ns - (self.host_ns[1] - self.host_ns[0])

    @property
    def graph_ns(self) -> int:
        return self.stamps_ns[-1] - self.stamps_ns[0] if self.stamps_ns else 0

    def node_times_ns(self) -> list[int]:
        s = self.stamps_ns
        return [s[i + 1] - s[i] for i in range(len(s) - 1)]


#: What a runner records per step (StepSamples for whole-step graphs, SegmentedStep for segments).
Step = TypeVar("Step")


@dataclass
class SampleBuffer(Generic[Step]):
    """Steps recorded for one captured graph.

    ``limit`` bounds memory on long runs: only the newest ``limit`` steps are
    kept (the schedule decides which steps are recorded at all).
    """

    limit: int | None = None
    steps: list[Step] = field(default_factory=list)

    def add(self, step: Step) -> None:
        self.steps.append(step)
        if self.limit is not None and len(self.steps) > self.limit:
            del self.steps[: len(self.steps) - self.limit]

    def clear(self) -> None:
        self.steps.clear()

    def __len__(self) -> int:
        return len(self.steps)
