"""Running one whole-step graph in place of the user's function.

A ``WholeStepRunner`` owns one captured step (one input signature, one path):
its plain and instrumented graphs compiled to generated code, the samples of
the steps it recorded, and the optional device timeline and allocator
sampler. With profiling, the first replay the schedule does not record runs
the plain graph under torch.profiler to measure each kernel's workspace
(runtime/workspace.py): a real step whose timings are not kept.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.fx

from graphprof.capture.distributed import refuse_ddp, wait_for_collectives
from graphprof.capture.errors import CaptureError
from graphprof.capture.whole_step import CapturedStep, capture_whole_step, run_captured
from graphprof.passes.instrument import Clock, instrument
from graphprof.passes.memory import memory
from graphprof.passes.pipeline import prepare_graph
from graphprof.runtime.allocator import AllocatorSampler, accelerator_type, add_allocator_samples, graph_device_types
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.collect import gradient_host_record, graph_record
from graphprof.runtime.device_clock import DeviceClock, DeviceTimeline, device_timeline
from graphprof.runtime.runner import RecordedSteps, StepTiming
from graphprof.runtime.samples import SampleBuffer, StepSamples
from graphprof.runtime.schedule import Action
from graphprof.runtime.workspace import Workspace, measure_workspace


class WholeStepRunner:
    """One captured signature: its graphs, and the samples recorded on it."""

    def __init__(self, captured: CapturedStep, instrumented: torch.fx.GraphModule, clock: Clock,
                 limit: int | None, profiling: bool, scheduled: bool) -> None:
        self.captured = captured
        self.instrumented = instrumented
        self.samples = SampleBuffer(limit=limit)
        self.sampler: AllocatorSampler | None = None  # accelerator allocator reads (sample_rate > 0)
        self.timeline: DeviceTimeline | None = None  # device events (graphs on an accelerator)
        self.workspace: dict[str, Workspace] | None = None  # measured kernel scratch per node name
        self.workspace_tried = not profiling
        self._scheduled = scheduled  # with a schedule, only a step it does not record measures workspace
        self._clock = clock
        self._executables: dict[bool, Callable[..., Any]] = {}

    @classmethod
    def capture(cls, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict, *, clock: Clock,
                limit: int | None, profiling: bool, scheduled: bool, sample_rate: int, timing: str,
                device_clock: DeviceClock | None) -> "WholeStepRunner":
        """Capture ``fn(*args, **kwargs)`` (this call's result is kept as ``captured.result``).

        Raises CaptureError with the user's state as it was before the call.
        """
        try:
            with refuse_ddp(fn):  # DDP's allreduce waits are not in a make_fx graph: capture/distributed.py
                captured = capture_whole_step(fn, args, kwargs)  # restores state on failure
        except Exception as exc:
            raise CaptureError.from_exception(name, exc) from exc
        try:
            prepare_graph(captured.graph_module)
            wait_for_collectives(captured.graph_module)  # replayed c10d ops wait on their Work, as eager does
            instrumented = instrument(captured.graph_module, clock)
        except Exception as exc:
            captured.undo()  # the step ran during capture; a fallback must not run it twice
            raise CaptureError.from_exception(name, exc) from exc
        runner = cls(captured, instrumented, clock, limit, profiling, scheduled)
        device = accelerator_type() if sample_rate else None
        if device is not None and device in graph_device_types(captured.graph_module):
            runner.sampler = AllocatorSampler(sample_rate)
            add_allocator_samples(runner.instrumented, runner.sampler)
        # After the allocator reads, so each device mark sits right after its op.
        runner.timeline = device_timeline(captured.graph_module, runner.instrumented, timing, device_clock)
        return runner

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
        if not self.workspace_tried and (not self._scheduled or action in (Action.NONE, Action.WARMUP)):
            return self._measure_workspace(leaves)
        if action is Action.NONE:
            return run_captured(self.captured, self.executable(False), leaves)[0]
        if self.sampler is not None:
            self.sampler.begin_step()
        if self.timeline is not None:
            self.timeline.begin_step()
        result, stamps, host = run_captured(self.captured, self.executable(True), leaves,
                                            instrumented=True, clock=self._clock)
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

    def _measure_workspace(self, leaves: list[Any]) -> Any:
        """Run this real step's plain graph under torch.profiler; record each node's kernel workspace.

        The step's result is the user's; its timings are not recorded (the
        profiler slows it down), as with a warm-up step.
        """
        self.workspace_tried = True
        gm = self.captured.graph_module
        # Drop the previous .grads (as the replay would) before the profiler
        # starts: freeing memory allocated before profiling makes torch warn.
        for p in self.captured.clear_grads:
            p.grad = None
        result, workspace = measure_workspace(
            gm, lambda: run_captured(self.captured, self.executable(False), leaves)[0])
        if workspace is not None:
            self.workspace = workspace
            memory(gm, {name: (w.peak_bytes, w.allocated_bytes) for name, w in workspace.items()})
        return result

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
                             [self.captured.graph_module], self.timeline, notes=notes)
