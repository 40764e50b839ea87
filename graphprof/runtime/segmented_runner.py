"""Running a step as torch.compile segments (capture="dynamo", or the fallback).

The first call here compiles (its result is the user's, nothing recorded);
later calls run the segments, probed when the schedule records the step.
Recorded steps are kept per input signature, like whole-step runners, so a
profile never mixes the segments of two signatures. Compiles after the first
call (dynamo's recompiles, an optimizer's new capture) are kept with the call
they happened in, their reason and their cost, for the profile's
``meta.recompiles``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Hashable

from graphprof.capture.segment_timeline import CompileSpan
from graphprof.capture.segmented import SegmentedCapture
from graphprof.passes.instrument import Clock
from graphprof.passes.pipeline import prepare_graph
from graphprof.profile.model import Recompile
from graphprof.runtime.comm import CommTimer, comm_timer_for, distributed_info
from graphprof.runtime.runner import RecordedSteps, StepTiming
from graphprof.runtime.samples import SampleBuffer
from graphprof.runtime.schedule import Action
from graphprof.runtime.fsdp_comm import FsdpCommTimer, fsdp_timer_for
from graphprof.runtime.segment_records import SegmentedStep, compute_intervals, segment_graph_records

log = logging.getLogger("graphprof")
_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)


class SegmentedRunner:
    """A torch.compile'd version of the user's function, with per-signature step buffers."""

    def __init__(self, name: str, fn: Callable[..., Any], clock: Clock, limit: int | None, cache_size: int,
                 optimizer_step: Callable[..., Any] | None = None, warned: bool = False) -> None:
        self._name = name
        self._fn = fn
        self._clock = clock
        self._limit = limit
        self._cache_size = cache_size
        self._comm: CommTimer | None = comm_timer_for(fn, clock)  # DDP bucket allreduce times
        self._fsdp: FsdpCommTimer | None = fsdp_timer_for(fn, clock)  # FSDP2 collectives and memory
        self.capture = SegmentedCapture(fn, prepare_graph, clock, optimizer_step, name, warned)
        self.capture.probing = False
        if self._fsdp is not None:
            self._fsdp.sink = lambda event: self.capture.timeline.events.append(event)
        self._compiled = False
        self._buffers: OrderedDict[Hashable, SampleBuffer[SegmentedStep]] = OrderedDict()
        self._key: Hashable = None
        self.recompiles: list[tuple[int, CompileSpan]] = []  # (call, span) after the first call

    def run(self, call: int, start_ns: int, action: Action, args: tuple, kwargs: dict,
            leaves: list[Any], key: Hashable = None) -> Any:
        if self.capture.runs_eagerly():  # gradient hooks whose order segments would change: nothing recorded
            return self._fn(*args, **kwargs)
        if not self._compiled:
            self._compiled = True
            return self.capture(*args, **kwargs)
        if key not in self._buffers:
            if self._buffers:
                log.info("graphprof: %s: new input signature; torch.compile may compile new segments", self._name)
            self._buffers[key] = SampleBuffer(limit=self._limit)
            while len(self._buffers) > self._cache_size:
                self._buffers.popitem(last=False)
        self._key = key
        self.capture.probing = action is not Action.NONE
        if self._comm is not None:
            self._comm.begin_step(action in _RECORDING)
        if self._fsdp is not None:
            self._fsdp.begin_step(action in _RECORDING)
        before = len(self.capture.compiles)
        try:
            result = self.capture(*args, **kwargs)
        finally:
            if self._fsdp is not None:
                self._fsdp.end_step(call)  # puts torch.distributed's functions back, whatever happened
        self.recompiles.extend((call, span) for span in self.capture.compiles[before:])
        if self._comm is not None:
            self._comm.end_step(call)
        if action in _RECORDING:
            events = tuple(self.capture.timeline.events)
            self._buffers[key].add(SegmentedStep(call, start_ns, self._clock(), events))
        return result

    def _samples(self) -> SampleBuffer[SegmentedStep]:
        return self._buffers.get(self._key) or SampleBuffer()

    def recorded(self) -> int:
        return len(self._samples())

    def clear_samples(self) -> None:
        self._samples().clear()

    def recorded_steps(self) -> RecordedSteps:
        steps = list(self._samples().steps)
        graphs = segment_graph_records(self.capture.segments, steps)
        if self._comm is not None:
            comm = self._comm.graph_record([s.index for s in steps], max(g.id for g in graphs) + 1)
            if comm is not None:
                graphs.append(comm)
        info = distributed_info(self._comm)
        if self._fsdp is not None:
            comm = self._fsdp.graph_record([s.index for s in steps], max(g.id for g in graphs) + 1)
            if comm is not None:
                graphs.append(comm)
            if info is not None:
                fsdp = self._fsdp.extra([s.index for s in steps], {s.index: compute_intervals(s) for s in steps})
                info = replace(info, fsdp=fsdp)
        return RecordedSteps("dynamo", graphs, [StepTiming(s.index, s.wall_ns, s.graph_ns) for s in steps],
                             [s.graph_module for s in self.capture.segments], None,
                             info, recompiles=self.recompile_notes())

    def recompile_notes(self) -> tuple[Recompile, ...]:
        """Every compile after the first call: when, what, why and what it cost (seconds)."""
        notes: list[Recompile] = []
        for call, span in self.recompiles:
            seconds = (span.end_ns - span.start_ns) / 1e9
            if span.backward_of_previous and notes and notes[-1].call == call:
                last = notes[-1]  # one recompile: its forward and its backward
                notes[-1] = replace(last, graphs=f"{last.graphs}, {span.what}",
                                    compile_time_s=last.compile_time_s + seconds)
                continue
            notes.append(Recompile(call, span.what, span.reason or "a new backward", seconds))
        return tuple(notes)
