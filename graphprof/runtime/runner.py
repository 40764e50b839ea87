"""What the policy (``tracing/``) needs from a way of running a step.

Two runners implement it: ``WholeStepRunner`` (one make_fx graph per input
signature and path) and ``SegmentedRunner`` (torch.compile segments). The
policy decides which runner handles a call and what the schedule asks of it;
a runner executes the call, keeps the samples of recorded steps and hands
them back as ``RecordedSteps``, from which ``runtime/assemble.py`` builds the
Profile. Neither side knows how the other works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch.fx

from graphprof.profile.model import DistributedInfo, GraphRecord, Recompile
from graphprof.runtime.device_clock import DeviceTimeline
from graphprof.runtime.schedule import Action


@dataclass(frozen=True)
class StepTiming:
    """One recorded step as the profile sees it: call index, wall and graph time in ns."""

    index: int
    wall_ns: int
    graph_ns: int


@dataclass(frozen=True)
class RecordedSteps:
    """A runner's recorded steps, turned into graph records, ready for a Profile."""

    mode: str  # "fx" or "dynamo": ProfileMeta.capture
    graphs: Sequence[GraphRecord]
    steps: Sequence[StepTiming]
    graph_modules: Sequence[torch.fx.GraphModule]  # where the device is read from
    timeline: DeviceTimeline | None = None
    distributed: DistributedInfo | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    recompiles: tuple[Recompile, ...] | None = None  # segmented capture only


class Runner(Protocol):
    """Runs calls of a traced function after its first (eager) call."""

    def run(self, call: int, start_ns: int, action: Action, args: tuple, kwargs: dict,
            leaves: list[Any]) -> Any:
        """Execute call ``call`` (started at ``start_ns``) as ``action`` says; return the user's result."""
        ...

    def recorded(self) -> int:
        """How many recorded steps are held."""
        ...

    def recorded_steps(self) -> RecordedSteps:
        """The held steps as graph records."""
        ...

    def clear_samples(self) -> None:
        """Forget the held steps (a completed schedule cycle)."""
        ...
