"""Running one whole-step graph in place of the user's function.

A ``WholeStepRunner`` owns one captured step (one input signature, one path):
its plain and instrumented graphs compiled to generated code, the samples of
the steps it recorded, and the optional device timeline and allocator
sampler.

Everything a replay needs is done inside the capture call, so that no later
call is spent on it and the first recorded step times the graph alone: both
graphs are compiled to code (runtime/codegen.py), and with profiling the
kernel workspace is measured on copies of the state the step writes
(runtime/workspace.py). Every call after the capture is then a user step
the schedule may record.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch.fx

from graphprof.capture.batches import flatten_call
from graphprof.capture.distributed import refuse_ddp, wait_for_collectives
from graphprof.capture.errors import CaptureError, StateNotRestored
from graphprof.capture.captured_step import CapturedStep, run_captured
from graphprof.capture.whole_step import capture_whole_step
from graphprof.passes.instrument import Clock, instrument
from graphprof.passes.memory import memory
from graphprof.passes.pipeline import prepare_graph
from graphprof.progress import stage
from graphprof.runtime.allocator import AllocatorSampler, accelerator_type, add_allocator_samples, graph_device_types
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.collect import gradient_host_record, graph_record
from graphprof.runtime.device_clock import DeviceClock, DeviceTimeline, device_timeline
from graphprof.runtime.failed_replays import (ReplayError, diagnose, random_devices, refuse_unsafe_overflow_checks,
                                              saved_generators)
from graphprof.runtime.kept_buffers import KeptBuffers, attribute
from graphprof.runtime.runner import RecordedSteps, StepTiming
from graphprof.runtime.samples import SampleBuffer, StepSamples
from graphprof.runtime.schedule import Action
from graphprof.runtime.workspace import Workspace, WorkspaceResult, measure_on_copies

log = logging.getLogger("graphprof")


class WholeStepRunner:
    """One captured signature: its graphs, and the samples recorded on it."""

    def __init__(self, captured: CapturedStep, instrumented: torch.fx.GraphModule, clock: Clock,
                 limit: int | None, kept: frozenset[torch.fx.Node] = frozenset()) -> None:
        self.captured = captured
        self.instrumented = instrumented
        self.samples: SampleBuffer[StepSamples] = SampleBuffer(limit=limit)
        self.sampler: AllocatorSampler | None = None  # accelerator allocator reads (sample_rate > 0)
        self.timeline: DeviceTimeline | None = None  # device events (graphs on an accelerator)
        self.workspace: dict[str, Workspace] | None = None  # measured kernel scratch per node name
        self.workspace_note = "not measured: profiling=False"  # meta.extra["workspace"]
        self._clock = clock
        self._executables: dict[bool, Callable[..., Any]] = {}
        self._random_devices = random_devices(captured.graph_module.graph)
        # Buffers written before an overflow check: copied at each replay's start (runtime/kept_buffers.py).
        self._kept_nodes = kept
        self._kept = KeptBuffers([attribute(captured.graph_module, n) for n in kept]) if kept else None

    @classmethod
    def capture(cls, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict, *, clock: Clock,
                limit: int | None, profiling: bool, sample_rate: int, timing: str,
                device_clock: DeviceClock | None) -> "WholeStepRunner":
        """Capture ``fn(*args, **kwargs)`` (this call's result is kept as ``captured.result``).

        Raises CaptureError with the user's state as it was before the call.
        """
        try:
            with refuse_ddp(fn), stage(f"capturing {name}"):  # DDP's waits are not in a make_fx graph
                captured = capture_whole_step(fn, args, kwargs)  # restores state on failure
        except StateNotRestored:  # not a capture that failed cleanly: nothing may run the step again
            raise
        except Exception as exc:
            raise CaptureError.from_exception(name, exc) from exc
        try:  # graphprof's own passes and code: what fails here falls back, from the state before the call
            kept = refuse_unsafe_overflow_checks(captured)
            with stage(f"annotating {name}'s {len(captured.graph_module.graph.nodes)} nodes"):
                prepare_graph(captured.graph_module)
            wait_for_collectives(captured.graph_module)  # replayed c10d ops wait on their Work, as eager does
            runner = cls(captured, instrument(captured.graph_module, clock), clock, limit, kept)
            runner._add_device_records(sample_rate, timing, device_clock)
            # Generate code now, not inside the first recorded step's time.
            with stage(f"generating code for {name}"):
                captured.compile_guards()
                runner.executable(False)
                if profiling:
                    runner.executable(True)
        except Exception as exc:
            captured.undo()  # the step ran during capture; a fallback must not run it twice
            raise CaptureError.from_exception(name, exc) from exc
        # The capture is committed: the write log's copies of the pre-call state are no longer needed.
        # Nothing from here on may fail on graphprof's account: the call's step has been made.
        captured.undo = _nothing_to_undo
        if profiling:
            with stage(f"measuring kernel workspace of {name}"):
                runner._measure_workspace(args, kwargs)
        if captured.structure is not None:  # the modules as the capture call leaves them, its own hooks gone
            captured.structure.settle()
        if captured.argument_writes is not None:  # last: nothing refuses the capture once the caller's lists change
            captured.argument_writes.commit(args, kwargs)
        captured.flush_output()
        return runner

    def _add_device_records(self, sample_rate: int, timing: str, device_clock: DeviceClock | None) -> None:
        """The accelerator's allocator reads (``sample_rate`` > 0) and device timeline, where the graph runs on one."""
        captured = self.captured
        device = accelerator_type() if sample_rate else None
        if device is not None and device in graph_device_types(captured.graph_module):
            self.sampler = AllocatorSampler(sample_rate)
            add_allocator_samples(self.instrumented, self.sampler)
        # After the allocator reads, so each device mark sits right after its op.
        self.timeline = device_timeline(captured.graph_module, self.instrumented, timing, device_clock)

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        return self.captured.graph_module

    def executable(self, instrumented: bool) -> Callable[..., Any]:
        """The graph (plain or instrumented) as fast generated code, compiled on first use."""
        fn = self._executables.get(instrumented)
        if fn is None:
            fn = self._executables[instrumented] = compile_graph(
                self.instrumented if instrumented else self.captured.graph_module)
        return fn

    # -- running ------------------------------------------------------------------
    def run(self, call: int, start_ns: int, action: Action, args: tuple, kwargs: dict,
            leaves: list[Any]) -> Any:
        writes = self.captured.argument_writes
        if writes is not None:  # the graph's effect changes this call's own lists and dicts, and drops them
            writes.current = (args, kwargs)
        # A copy of the default generators the graph draws from: a replay that raises can then be run
        # again eagerly from the call's own state (runtime/failed_replays.py). Only graphs that draw pay it.
        restore = saved_generators(self._random_devices) if self._random_devices else _nothing_to_undo
        if self._kept is not None:  # only graphs whose overflow check comes after a buffer's write pay it
            self._kept.take()
            restore = _and_then(restore, self._kept.put_back)
        executable = self.executable(action is not Action.NONE)
        try:
            return self._run(executable, call, start_ns, action, leaves)
        except Exception as exc:
            raise ReplayError(exc, diagnose(self.captured, executable, exc, restore, self._kept_nodes)) from exc

    def _run(self, executable: Callable[..., Any], call: int, start_ns: int, action: Action,
             leaves: list[Any]) -> Any:
        if action is Action.NONE:
            return run_captured(self.captured, executable, leaves)[0]
        if self.sampler is not None:
            self.sampler.begin_step()
        if self.timeline is not None:
            self.timeline.begin_step()
        result, stamps, host = run_captured(self.captured, executable, leaves, instrumented=True, clock=self._clock)
        if self.timeline is not None:
            self.timeline.finish()  # the step's one device synchronisation, inside its wall time
        if action is Action.WARMUP:
            return result
        self.samples.add(StepSamples(call, self._clock() - start_ns, stamps, host))
        if self.sampler is not None:
            self.sampler.end_step(call)
        if self.timeline is not None:
            self.timeline.end_step(call)
        return result

    def _measure_workspace(self, args: tuple, kwargs: dict) -> None:
        """Measure each node's kernel workspace on copies of the written state (runtime/workspace.py).

        Runs inside the capture call, after its step was made: the user's
        tensors are only read, and nothing here raises to the caller. The
        memory records are recomputed with the figures, or the profile says
        why there are none.
        """
        gm = self.captured.graph_module
        try:
            result: WorkspaceResult = measure_on_copies(gm, _graph_inputs(self.captured, args, kwargs), compile_graph)
            if result.by_node is not None:
                memory(gm, {name: (w.peak_bytes, w.allocated_bytes) for name, w in result.by_node.items()})
        except Exception as exc:  # graphprof's own pass failed: the profile loses these figures, not the step
            log.debug("graphprof: workspace not recorded: %r", exc)
            result = WorkspaceResult(None, f"the measurement failed ({type(exc).__name__}: {exc})")
            memory(gm)  # the shape-based records the passes wrote, which a failed recomputation may have left half done
        self.workspace_note = result.note
        self.workspace = result.by_node

    # -- results ------------------------------------------------------------------
    def recorded(self) -> int:
        return len(self.samples)

    def clear_samples(self) -> None:
        self.samples.clear()
        if self.sampler is not None:
            self.sampler.clear()
        if self.timeline is not None:
            self.timeline.clear()

    def recorded_steps(self) -> RecordedSteps:
        steps = list(self.samples.steps)
        device_memory = self.sampler.samples(s.index for s in steps) if self.sampler is not None else ()
        device_times = self.timeline.times(s.index for s in steps) if self.timeline is not None else None
        graphs = [graph_record(self.captured.graph_module, steps, device_memory=device_memory,
                               device_times=device_times, workspace=self.workspace)]
        host = gradient_host_record(steps, graph_id=1)
        if host is not None:
            graphs.append(host)
        # The checks a replay of this graph passed: branches on inputs and on values computed from them.
        guards = list(dict.fromkeys(g.describe() for g in self.captured.guards))
        notes = {"guards": guards} if guards else {}
        return RecordedSteps("fx", graphs, [StepTiming(s.index, s.wall_ns, s.graph_ns) for s in steps],
                             [self.captured.graph_module], self.timeline,
                             notes={"workspace": self.workspace_note, **notes})


def _graph_inputs(captured: CapturedStep, args: tuple, kwargs: dict) -> list[Any]:
    """The values of ``captured``'s placeholders in the call of ``args`` and ``kwargs``, in order."""
    leaves, _ = flatten_call(args, kwargs)
    return [leaves[i] for i in captured.input_positions]


def _and_then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    """A function that calls ``first``, then ``second``."""
    def both() -> None:
        first()
        second()
    return both


def _nothing_to_undo() -> None:
    """A committed capture's ``undo``: its step is the user's now."""
