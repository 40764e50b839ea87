"""What a segmented step records: its compiled graphs, and what ran in one call, in order.

The capture (capture/segmented.py) and the optimizer routing
(capture/routed_optimizers.py) write these; the runner
(runtime/segmented_runner.py, runtime/segment_records.py) turns them into
host gaps, compile spans and per-node samples. Plain records, apart from
the capture so that readers need not import its machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from graphprof.profile.model import GraphKind


@dataclass
class Segment:
    """One compiled graph of a segmented step."""

    id: int
    kind: GraphKind
    name: str
    graph_module: torch.fx.GraphModule
    instrumented: torch.fx.GraphModule


@dataclass(frozen=True)
class CompileSpan:
    """Time the step spent compiling (dynamo) or capturing (an optimizer): not the user's work."""

    start_ns: int
    end_ns: int
    what: str  # the graph(s) compiled, or the optimizer captured
    reason: str  # dynamo's guard failure, or why the optimizer was captured
    backward_of_previous: bool = False  # AOTAutograd compiled the backward of the previous compile lazily


@dataclass(frozen=True)
class OptimizerRun:
    """One call of an optimizer's step: its replayed graph's stamps, or none (an unprofiled run)."""

    slot: int
    start_ns: int
    end_ns: int
    stamps: tuple[int, ...] = ()
    graph_module: torch.fx.GraphModule | None = None  # the graph the stamps belong to


@dataclass
class StepTimeline:
    """What ran during one segmented step, in order: segment stamps, host reads, compiles, optimizer runs."""

    events: list[Any] = field(default_factory=list)
