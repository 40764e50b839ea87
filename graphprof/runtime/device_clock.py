"""The device clock: device self time per node from timed events between op nodes.

On an accelerator the host probes measure dispatch (ops return once their
kernels are queued). For the device's side, every graph that runs on an
accelerator gets device marks (``graphprof.passes.device_probes``) that
record timed events (``torch.Event(enable_timing=True)``) on the current
stream. After the graph, ONE synchronisation; then a node's device time is
``start.elapsed_time(end)`` (milliseconds, stored in seconds) of its two
events. Nothing else waits for the device, so the step runs as it would
unprofiled (``timing="pipelined"``). ``timing="isolated"`` also
synchronises after every op, for per-op times without overlap.

Everything goes through ``torch.accelerator`` and ``torch.Event``: CUDA,
ROCm, XPU, MPS and out-of-tree backends (DIPU, ...) share one path. The
clock is injectable (``DeviceClock``): tests drive the same arithmetic
with fake events on machines without a device.

Events are made once per captured graph and reused every step; reusing is
safe because a step's times are read (after its synchronisation) before the
next step records them again. Mark functions are closures over their
timeline, not a process-wide "active timeline": two traced functions, or
threads, never share one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch
import torch.fx

from graphprof.passes.device_probes import add_device_marks, event_count, event_pairs, timed_op_nodes
from graphprof.passes.records import ANNOTATION
from graphprof.runtime.allocator import accelerator_type
from graphprof.profile.records import NS_PER_S, DeviceInfo

TIMINGS = ("pipelined", "isolated")
#: Steps of device times kept at most (the sample buffer keeps fewer).
_MAX_STEPS_KEPT = 10_000
#: Device times are kept in whole nanoseconds, the unit of every sample (far below an event's resolution).
_NS_PER_MS = NS_PER_S // 1000


class TimedEvent(Protocol):
    """What the timeline needs of an event: ``torch.Event``'s record and elapsed_time (ms)."""

    def record(self, stream: Any = None) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


@dataclass(frozen=True)
class DeviceClock:
    """How a timeline reaches one device; ``accelerator_clock`` makes the real one, tests pass fakes.

    ``event_factory`` makes a timed event, ``synchronize`` waits for the
    device, ``stream`` returns the stream to record on (the current one),
    ``name`` and ``capability`` describe the device for the profile's meta.
    """

    device: str
    event_factory: Callable[[], TimedEvent]
    synchronize: Callable[[], None]
    stream: Callable[[], Any] = lambda: None
    name: str = ""
    capability: str = ""
    #: Host cost of one mark (measured for real devices only): part of every node's host time.
    mark_cost_s: float | None = None

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]


class DeviceTimeline:
    """The events of one captured graph and the device times read from them, per profiled step.

    Per step: ``begin_step`` (rewind, pick the stream), the graph runs its
    marks, ``finish`` (the one synchronisation), ``end_step`` (read times).
    """

    def __init__(self, clock: DeviceClock, nodes: int, isolated: bool = False,
                 node_ids: Sequence[int] | None = None) -> None:
        self.clock = clock
        self.nodes = nodes
        self.isolated = isolated
        # Annotation index of each timed node, when not simply 0..nodes-1 (times are read in graph order).
        self._node_ids = None if node_ids is None or list(node_ids) == list(range(nodes)) else tuple(node_ids)
        self._events = [clock.event_factory() for _ in range(event_count(nodes, isolated))]
        self._pairs = event_pairs(nodes, isolated)
        self._next = 0
        self._stream: Any = None
        self._steps: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    @property
    def timing(self) -> str:
        return "isolated" if self.isolated else "pipelined"

    @property
    def events_per_step(self) -> int:
        return len(self._events)

    def mark_functions(self) -> tuple[Callable[[], None], Callable[[], None] | None]:
        """The functions the graph calls: a plain mark, and (isolated) a mark that synchronises."""
        events = self._events
        timeline = self

        def device_mark() -> None:
            i = timeline._next
            timeline._next = i + 1
            events[i].record(timeline._stream)

        if not self.isolated:
            return device_mark, None
        synchronize = self.clock.synchronize

        def device_mark_and_sync() -> None:
            i = timeline._next
            timeline._next = i + 1
            events[i].record(timeline._stream)
            synchronize()

        return device_mark, device_mark_and_sync

    def begin_step(self) -> None:
        """Before a graph run: the marks start again at the first event, on the current stream."""
        self._next = 0
        self._stream = self.clock.stream()

    def finish(self) -> None:
        """After a graph run: the step's one synchronisation (the events are complete afterwards)."""
        self.clock.synchronize()

    def end_step(self, step: int) -> None:
        """Read the finished run's device times and keep them as profiled step ``step``."""
        if self._next != len(self._events):
            raise RuntimeError(f"graphprof: {self._next} device events were recorded in a step that has "
                               f"{len(self._events)}; the graph did not run its marks")
        events = self._events
        times = [round(events[a].elapsed_time(events[b]) * _NS_PER_MS) for a, b in self._pairs]
        if self._node_ids is not None:  # by annotation index, as the profile's nodes are numbered
            by_id = [0] * (max(self._node_ids, default=-1) + 1)
            for node_id, ns in zip(self._node_ids, times):
                by_id[node_id] = ns
            times = by_id
        self._steps[step] = tuple(times)
        while len(self._steps) > _MAX_STEPS_KEPT:
            self._steps.popitem(last=False)

    def times(self, steps: Iterable[int]) -> list[tuple[int, ...]] | None:
        """Per step (in the given order), each op node's device time in ns, by annotation index; None if a step has none."""
        out = []
        for step in steps:
            times = self._steps.get(step)
            if times is None:
                return None
            out.append(times)
        return out

    def clear(self) -> None:
        self._steps.clear()


def attach_timeline(gm: torch.fx.GraphModule, clock: DeviceClock, isolated: bool = False) -> DeviceTimeline:
    """A timeline for the instrumented graph ``gm``, with its marks inserted into ``gm`` (in place)."""
    ops = timed_op_nodes(gm)
    timeline = DeviceTimeline(clock, len(ops), isolated, [n.meta[ANNOTATION].index for n in ops])
    mark, end_mark = timeline.mark_functions()
    placed = add_device_marks(gm, mark, end_mark)
    assert placed == timeline.events_per_step, (placed, timeline.events_per_step)
    return timeline


# -- the real device -----------------------------------------------------------------------
def graph_accelerator(gm: torch.fx.GraphModule) -> str | None:
    """The first accelerator device ("cuda:0") that an op node of ``gm`` reads or writes, else None.

    Only the current accelerator's type counts; tensors on the CPU (or the
    meta device) make no graph an accelerator graph.
    """
    kind = accelerator_type()
    if kind is None:
        return None
    for node in gm.graph.nodes:
        ann = node.meta.get(ANNOTATION)
        if ann is None:
            continue
        for info in (*ann.in_tensors, *ann.out_tensors):
            if info is not None and info.device.split(":")[0] == kind:
                return info.device
    return None


def _indexed(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device(dev.type, torch.accelerator.current_device_index())
    return dev


def device_name(device: str) -> str:
    """The device's marketing name where its backend module says (``get_device_name``), else its type."""
    kind = device.split(":")[0]
    try:
        getter = getattr(torch.get_device_module(kind), "get_device_name", None)
        if getter is not None:
            return str(getter(_indexed(device).index))
    except Exception:  # a backend without names, an unknown type, no device: the type still identifies it
        pass
    return kind


def device_capability(device: str) -> str:
    """Compute capability as the backend spells it: ``sm_90`` on CUDA, the gfx arch on ROCm, else ``major.minor``.

    Empty when the backend exposes none (the torch.accelerator dict of
    supported dtypes is not a capability in this sense).
    """
    try:
        dev = torch.device(device)
        module = torch.get_device_module(dev.type)
        index = _indexed(device).index
        props = getattr(module, "get_device_properties", None)
        arch = getattr(props(index), "gcnArchName", "") if props is not None else ""
        if str(arch).startswith("gfx"):  # ROCm: the GPU's ISA, e.g. gfx942
            return str(arch).split(":")[0]
        cap = getattr(module, "get_device_capability", lambda _: None)(index)
    except Exception:
        return ""
    if isinstance(cap, tuple) and len(cap) == 2 and all(isinstance(v, int) for v in cap):
        return f"sm_{cap[0]}{cap[1]}" if dev.type == "cuda" else f"{cap[0]}.{cap[1]}"
    return ""


def accelerator_clock(device: str) -> DeviceClock:
    """The device clock of a real accelerator device, through torch.accelerator and torch.Event."""
    dev = _indexed(device)
    clock = DeviceClock(
        device=str(dev),
        event_factory=lambda: torch.Event(device=dev, enable_timing=True),
        synchronize=lambda: torch.accelerator.synchronize(dev),
        stream=lambda: torch.accelerator.current_stream(dev),
        name=device_name(str(dev)),
        capability=device_capability(str(dev)),
    )
    return replace(clock, mark_cost_s=mark_cost_s(clock))


def device_timeline(graph: torch.fx.GraphModule, instrumented: torch.fx.GraphModule, timing: str,
                    clock: DeviceClock | None = None) -> DeviceTimeline | None:
    """Device marks and their timeline for a captured graph, or None for a graph that runs on the CPU.

    ``clock`` overrides the choice (tests pass a fake one): it then times
    the graph wherever its tensors live.
    """
    if clock is None:
        device = graph_accelerator(graph)
        if device is None:
            return None
        clock = accelerator_clock(device)
    return attach_timeline(instrumented, clock, isolated=timing == "isolated")


def profile_device(timeline: DeviceTimeline | None,
                   graphs: Iterable[torch.fx.GraphModule]) -> tuple[str, str | None, DeviceInfo]:
    """The profile meta's device: (device type, name or None for the host's, how it was timed).

    ``DeviceInfo.timing`` is "pipelined"/"isolated" with device events, "host"
    when only the host clock ran; where known it names the device
    (``"cuda:0"``), its capability and the cost of one device mark.
    """
    if timeline is not None:
        clock = timeline.clock
        info = DeviceInfo(timing=timeline.timing, device=clock.device, capability=clock.capability or "",
                          mark_cost_s=clock.mark_cost_s)
        return clock.device_type, clock.name or clock.device_type, info
    for gm in graphs:
        device = graph_accelerator(gm)
        if device is not None:
            info = DeviceInfo(timing="host", device=device, capability=device_capability(device) or "")
            return device.split(":")[0], device_name(device), info
    return "cpu", None, DeviceInfo(timing="host")


def mark_cost_s(clock: DeviceClock, samples: int = 200, host_clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """Host cost of one device mark (recording a timed event), in seconds: part of every node's host time."""
    event = clock.event_factory()
    stream = clock.stream()
    event.record(stream)
    clock.synchronize()
    t0 = host_clock()
    for _ in range(samples):
        event.record(stream)
    t1 = host_clock()
    clock.synchronize()
    return (t1 - t0) * 1e-9 / samples
