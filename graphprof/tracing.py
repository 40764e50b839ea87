"""``@graphprof.trace``: the one place the pipeline is assembled.

Call 1 runs the user's function eagerly (lazily created state, such as
optimizer moments, comes into existence). Call 2 captures it with make_fx
while executing it: its result is that step's result. Later calls run the
captured graph, instrumented when ``profiling=True``; with profiling, the
first replayed call runs the plain graph under torch.profiler to measure
each kernel's workspace (runtime/workspace.py) and, like a warm-up step, is
not recorded (with a schedule: the first call the schedule does not record,
a skipped, waiting or warm-up one). A new input signature,
or changed optimizer hyperparameters or module train/eval modes, captures
again (bounded by ``cache_size``), like ``torch.compile``'s recompiles.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import torch
import torch.fx
import torch.utils._pytree as pytree

from graphprof.api import Profile
from graphprof.capture.distributed import refuse_ddp, wait_for_collectives
from graphprof.capture.errors import CaptureError
from graphprof.capture.state import StateIndex
from graphprof.capture.segmented import SegmentedCapture
from graphprof.capture.whole_step import CapturedStep, capture_whole_step, run_captured
from graphprof.analysis.coverage import node_coverage
from graphprof.passes.annotate import annotate
from graphprof.passes.op_attrs import op_attrs
from graphprof.passes.cost import cost
from graphprof.passes.instrument import Clock, instrument, probe_cost_ns
from graphprof.passes.memory import memory
from graphprof.runtime.allocator import AllocatorSampler, accelerator_type, add_allocator_samples, graph_device_types
from graphprof.runtime.calibrate import load_cached
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.device_clock import TIMINGS, DeviceClock, DeviceTimeline, device_timeline, profile_device
from graphprof.runtime.comm import CommTimer, comm_timer_for, distributed_extra
from graphprof.runtime.collect import gradient_host_record, build_profile, graph_record, profile_meta
from graphprof.runtime.samples import SampleBuffer, StepSamples
from graphprof.runtime.schedule import Action, Schedule
from graphprof.runtime.segment_records import SegmentedStep, segment_graph_records
from graphprof.runtime.workspace import Workspace, measure_workspace

log = logging.getLogger("graphprof")
_CAPTURE_MODES = ("auto", "fx", "dynamo")
#: Without a schedule every call after capture is recorded; only the newest
#: steps are kept so that memory stays bounded on long runs.
DEFAULT_MAX_STEPS = 100


def prepare_graph(gm: torch.fx.GraphModule) -> None:
    """The passes every captured graph goes through, whole-step or segment, in order."""
    annotate(gm)
    cost(gm)
    memory(gm)
    op_attrs(gm)


@functools.lru_cache(maxsize=None)
def _probe_cost_s() -> float:
    return probe_cost_ns() * 1e-9


def _signature(args: tuple, kwargs: dict) -> tuple[Hashable, list[Any]]:
    """What a captured graph is specialised to (tensor metadata, other values by
    equality), and the flattened inputs, so a replay flattens them only once."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    parts: list[Hashable] = [spec, torch.is_grad_enabled()]  # TreeSpec hashes by structure
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        else:
            try:
                hash(leaf)
                parts.append((type(leaf), leaf))
            except TypeError:
                parts.append((type(leaf), id(leaf)))
    return tuple(parts), leaves


def _guard_values(state: StateIndex) -> tuple:
    """Python values baked into a graph: optimizer hyperparameters, module modes."""
    hyper = tuple(
        tuple((k, v) for k, v in group.items() if k != "params" and isinstance(v, (int, float, bool, str, tuple, type(None))))
        for opt in state.optimizers for group in opt.param_groups
    )
    modes = tuple(m.training for _, m in state.modules.values())
    return hyper, modes


@dataclass
class _Entry:
    """One captured signature: its graphs and the samples recorded on it."""

    captured: CapturedStep
    instrumented: torch.fx.GraphModule
    guards: tuple
    samples: SampleBuffer = field(default_factory=SampleBuffer)
    sampler: AllocatorSampler | None = None  # accelerator allocator reads (sample_rate > 0)
    timeline: DeviceTimeline | None = None  # device events (graphs on an accelerator)
    workspace: dict[str, Workspace] | None = None  # measured kernel scratch per node name
    workspace_tried: bool = False
    _executables: dict[bool, Callable[..., Any]] = field(default_factory=dict)

    def executable(self, instrumented: bool) -> Callable[..., Any]:
        """The graph (plain or instrumented) as fast generated code, compiled on first use."""
        fn = self._executables.get(instrumented)
        if fn is None:
            fn = self._executables[instrumented] = compile_graph(
                self.instrumented if instrumented else self.captured.graph_module)
        return fn


class TracedFunction:
    """A user function replaced by its captured, optionally instrumented, graph."""

    def __init__(self, fn: Callable[..., Any], *, profiling: bool = True, capture: str = "auto",
                 cache_size: int = 8, clock: Clock = time.perf_counter_ns,
                 schedule: Schedule | None = None,
                 on_profile_ready: Callable[[Profile], Any] | None = None,
                 max_steps: int = DEFAULT_MAX_STEPS, sample_rate: int = 0,
                 peaks: dict[str, float] | None = None, timing: str = "pipelined",
                 device_clock: DeviceClock | None = None) -> None:
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
        # Device events on an accelerator: one synchronisation per step ("pipelined") or after
        # every op ("isolated"); ``device_clock`` replaces the real device (tests pass a fake).
        self.timing = timing
        self._device_clock = device_clock
        if sample_rate < 0:
            raise ValueError("sample_rate must be 0 (no allocator samples) or a positive number of ops")
        self.sample_rate = sample_rate
        if peaks is not None and not {"flops_per_s", "bytes_per_s"} <= set(peaks):
            raise ValueError("peaks needs 'flops_per_s' and 'bytes_per_s' (optionally 'flops_per_s_<dtype>')")
        # Peaks for the roofline: given by hand, else the cached `graphprof calibrate` result.
        self.peaks = dict(peaks) if peaks is not None else None
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError("schedule must come from graphprof.schedule(...)")
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if capture not in _CAPTURE_MODES:
            raise ValueError(f"capture must be one of {', '.join(_CAPTURE_MODES)}, not {capture!r}")
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        functools.update_wrapper(self, fn)
        if not hasattr(self, "__name__"):  # a module or other callable object
            self.__name__ = type(fn).__name__
        self._fn = fn
        self.profiling = profiling
        self.capture = capture
        self.cache_size = cache_size
        self._clock = clock
        self._calls = 0
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._current: _Entry | None = None
        self.schedule = schedule
        self.on_profile_ready = on_profile_ready
        self.max_steps = max_steps
        self._cycles: list[Profile] = []
        self._segmented: SegmentedCapture | None = None
        # Segmented steps are kept per input signature, like captured entries.
        self._segment_buffers: OrderedDict[Hashable, SampleBuffer] = OrderedDict()
        self._segment_key: Hashable = None
        self._comm: CommTimer | None = None  # DDP bucket allreduce times (segmented capture)

    def _action(self, call: int) -> Action:
        if not self.profiling:
            return Action.NONE
        if self.schedule is None:
            return Action.RECORD
        return self.schedule(call)

    # -- calling ----------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = self._clock()
        call = self._calls
        self._calls += 1
        if call == 0:
            return self._fn(*args, **kwargs)
        if self._segmented is not None or self.capture == "dynamo":
            return self._call_segmented(call, start, args, kwargs)
        key, leaves = _signature(args, kwargs)
        entry = self._entries.get(key)
        if entry is not None and entry.guards != _guard_values(entry.captured.state):
            log.info("graphprof: %s: optimizer hyperparameters or module modes changed; capturing again",
                     self.__name__)
            del self._entries[key]
            entry = None
        if entry is None:
            try:
                entry = self._capture(key, args, kwargs)
            except CaptureError as exc:
                if self.capture != "auto":
                    raise
                warnings.warn(f"graphprof: {exc}; profiling {self.__name__} as torch.compile segments instead",
                              stacklevel=2)
                return self._call_segmented(call, start, args, kwargs)
            self._current = entry
            return entry.captured.result
        self._current = entry
        action = self._action(call)
        if self.profiling and not entry.workspace_tried and (
                self.schedule is None or action in (Action.NONE, Action.WARMUP)):
            return self._measure_workspace(entry, leaves)
        if action is Action.NONE:
            return run_captured(entry.captured, entry.executable(False), leaves)[0]
        if entry.sampler is not None:
            entry.sampler.begin_step()
        if entry.timeline is not None:
            entry.timeline.begin_step()
        result, stamps, host = run_captured(entry.captured, entry.executable(True), leaves,
                                            instrumented=True, clock=self._clock)
        if entry.timeline is not None:
            entry.timeline.finish()  # the step's one device synchronisation, inside its wall time
        if action is Action.WARMUP:
            return result
        entry.samples.add(StepSamples(call, self._clock() - start, stamps, host))
        if entry.sampler is not None:
            entry.sampler.end_step(call)
        if entry.timeline is not None:
            entry.timeline.end_step(call)
        if action is Action.RECORD_AND_SAVE:
            self._complete_cycle(entry)
        return result

    def _measure_workspace(self, entry: _Entry, leaves: list[Any]) -> Any:
        """Run this real step's plain graph under torch.profiler; record each node's kernel workspace.

        The step's result is the user's; its timings are not recorded (the
        profiler slows it down), as with a warm-up step.
        """
        entry.workspace_tried = True
        gm = entry.captured.graph_module
        # Drop the previous .grads (as the replay would) before the profiler
        # starts: freeing memory allocated before profiling makes torch warn.
        for p in entry.captured.clear_grads:
            p.grad = None
        result, workspace = measure_workspace(
            gm, lambda: run_captured(entry.captured, entry.executable(False), leaves)[0])
        if workspace is not None:
            entry.workspace = workspace
            memory(gm, {name: (w.peak_bytes, w.allocated_bytes) for name, w in workspace.items()})
        return result

    def _call_segmented(self, call: int, start: int, args: tuple, kwargs: dict) -> Any:
        """Segmented capture: the first call here compiles, later ones run the segments."""
        if self._segmented is None:
            self._comm = self._comm or comm_timer_for(self._fn, self._clock)
            self._segmented = SegmentedCapture(self._fn, prepare_graph, self._clock)
            self._segmented.probing = False
            return self._segmented(*args, **kwargs)
        key = _signature(args, kwargs)[0]
        if key not in self._segment_buffers:
            if self._segment_buffers:
                log.info("graphprof: %s: new input signature; torch.compile may compile new segments", self.__name__)
            self._segment_buffers[key] = SampleBuffer(limit=None if self.schedule else self.max_steps)
            while len(self._segment_buffers) > self.cache_size:
                self._segment_buffers.popitem(last=False)
        self._segment_key = key
        action = self._action(call)
        self._segmented.probing = action is not Action.NONE
        if self._comm is not None:
            self._comm.begin_step(action in (Action.RECORD, Action.RECORD_AND_SAVE))
        result = self._segmented(*args, **kwargs)
        if self._comm is not None:
            self._comm.end_step(call)
        if action in (Action.RECORD, Action.RECORD_AND_SAVE):
            events = tuple(self._segmented.timeline.events)
            self._segment_buffers[key].add(SegmentedStep(call, start, self._clock(), events))
            if action is Action.RECORD_AND_SAVE:
                self._complete_cycle(None)
        return result

    @property
    def _segment_samples(self) -> SampleBuffer:
        return self._segment_buffers.get(self._segment_key) or SampleBuffer()

    def _complete_cycle(self, entry: _Entry | None) -> None:
        profile = self._profile_of(entry, cycle=len(self._cycles))
        (entry.samples if entry is not None else self._segment_samples).clear()
        if entry is not None and entry.sampler is not None:
            entry.sampler.clear()
        if entry is not None and entry.timeline is not None:
            entry.timeline.clear()
        self._cycles.append(profile)
        if self.on_profile_ready is not None:
            self.on_profile_ready(profile)

    def _capture(self, key: Hashable, args: tuple, kwargs: dict) -> _Entry:
        if self._entries:
            log.info("graphprof: %s: new input signature; capturing graph %d", self.__name__, len(self._entries) + 1)
        try:
            with refuse_ddp(self._fn):  # DDP's allreduce waits are not in a make_fx graph: capture/distributed.py
                captured = capture_whole_step(self._fn, args, kwargs)  # restores state on failure
        except Exception as exc:
            raise CaptureError.from_exception(self.__name__, exc) from exc
        try:
            prepare_graph(captured.graph_module)
            wait_for_collectives(captured.graph_module)  # replayed c10d ops wait on their Work, as eager does
            instrumented = instrument(captured.graph_module, self._clock)
        except Exception as exc:
            captured.undo()  # the step ran during capture; a fallback must not run it twice
            raise CaptureError.from_exception(self.__name__, exc) from exc
        entry = _Entry(captured, instrumented, _guard_values(captured.state),
                       SampleBuffer(limit=None if self.schedule else self.max_steps))
        device = accelerator_type() if self.sample_rate else None
        if device is not None and device in graph_device_types(captured.graph_module):
            entry.sampler = AllocatorSampler(self.sample_rate)
            add_allocator_samples(entry.instrumented, entry.sampler)
        # After the allocator reads, so each device mark sits right after its op.
        entry.timeline = device_timeline(captured.graph_module, entry.instrumented, self.timing, self._device_clock)
        self._entries[key] = entry
        while len(self._entries) > self.cache_size:
            self._entries.popitem(last=False)
        return entry

    # -- results ------------------------------------------------------------------
    def get_profile(self, all: bool = False) -> Any:
        """The latest profile; with ``all=True`` a list of every completed cycle.

        With a schedule, the latest profile is that of the last completed
        cycle. Without one, it covers the steps recorded on the graph run
        last (at most ``max_steps``, newest kept).
        """
        if self.schedule is not None:
            if not self._cycles:
                raise RuntimeError(
                    f"no profiling cycle of {self.__name__} has completed yet ({self._calls} calls so far; "
                    f"the schedule records {self.schedule.describe()})"
                )
            return list(self._cycles) if all else self._cycles[-1]
        entry = self._current
        if self._segmented is not None:
            if not self._segment_samples:
                raise RuntimeError(f"no profiled step yet for {self.__name__} (segmented capture: the first call "
                                   "after the eager one compiles, later calls are profiled)")
            profile = self._profile_of(None)
            return [profile] if all else profile
        if entry is None or not entry.samples:
            raise RuntimeError(
                f"no profiled step yet for {self.__name__}: call 1 runs eagerly, call 2 captures the graph, "
                "call 3 measures kernel workspace and calls from 4 on are profiled (with profiling=True)"
            )
        profile = self._profile_of(entry)
        return [profile] if all else profile

    def _profile_of(self, entry: _Entry | None, cycle: int | None = None) -> Profile:
        if entry is None:
            steps = list(self._segment_samples.steps)
            graphs = segment_graph_records(self._segmented.segments, steps)
            comm = self._comm.graph_record([s.index for s in steps], max(g.id for g in graphs) + 1) if self._comm else None
            graphs += [comm] if comm is not None else []
            mode = "dynamo"
        else:
            steps = list(entry.samples.steps)
            device_memory = entry.sampler.samples(s.index for s in steps) if entry.sampler is not None else ()
            device_times = entry.timeline.times(s.index for s in steps) if entry.timeline is not None else None
            graphs = [graph_record(entry.captured.graph_module, steps, device_memory=device_memory,
                                   device_times=device_times, workspace=entry.workspace)]
            host = gradient_host_record(steps, graph_id=1)
            if host is not None:
                graphs.append(host)
            mode = "fx"
        extra: dict[str, Any] = {
            "cost_coverage": node_coverage(n for g in graphs for n in g.nodes).to_dict(),
        }
        distributed = distributed_extra(self._comm)
        if distributed is not None:
            extra["distributed"] = distributed
        if self.schedule is not None:
            extra["schedule"] = {k: getattr(self.schedule, k) for k in ("skip_first", "wait", "warmup", "active", "repeat")}
            extra["cycle"] = cycle
        device_type, device_name, device_extra = profile_device(
            entry.timeline if entry is not None else None,
            [entry.captured.graph_module] if entry is not None else [s.graph_module for s in self._segmented.segments])
        extra.update(device_extra)
        peaks = self.peaks if self.peaks is not None else load_cached(device_type)
        meta = profile_meta(self.__name__, mode, _probe_cost_s() if self._clock is time.perf_counter_ns else 0.0,
                            peaks=peaks, device_type=device_type, device_name=device_name, **extra)
        return build_profile(graphs, steps, meta, cls=Profile)

    def reset(self) -> None:
        """Forget captured graphs and samples; the next call runs eagerly again."""
        self._entries.clear()
        self._current = None
        self._calls = 0
        self._cycles.clear()
        self._segmented = None
        self._segment_buffers.clear()

    @property
    def graph_module(self) -> torch.fx.GraphModule | None:
        """The captured (uninstrumented) graph of the last call, for inspection."""
        return self._current.captured.graph_module if self._current else None


def trace(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Capture ``fn`` as a static graph and profile every node.

    Usable as ``@trace``, ``@trace(profiling=True)`` and ``trace(fn, ...)``;
    ``options`` are TracedFunction's keyword arguments.
    """
    def wrap(f: Callable[..., Any]) -> TracedFunction:
        return TracedFunction(f, **options)

    return wrap(fn) if fn is not None else wrap
