"""Segmented capture: a torch.compile backend whose graphs come from AOTAutograd.

For steps one static trace cannot hold (``.item()`` logging, NumPy calls,
Python branches on tensor values, prints), dynamo splits the step at graph
breaks and AOTAutograd turns each piece into forward, backward and inference
(optimizer) graphs. Each graph gets a ``CaptureRecord`` per op from the
metadata AOTAutograd keeps (``nn_module_stack``, ``fwd_nn_module_stack`` on
backward nodes, ``stack_trace``), then goes through the same passes as a
whole-step graph (the ``prepare`` callback): one pipeline, not a copy.

At run time each compiled segment runs either its plain or its instrumented
graph, and appends its probe stamps to the step's timeline. Between segments
the host runs Python (guards, glue, eager code at graph breaks); that time is
kept as host gaps, and host reads of tensors there (``.item()``, ``.numpy()``,
``.cpu()``, ``.tolist()``) are timed individually through ``sys.setprofile``,
which is switched off while a segment runs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd

from graphprof.passes.annotate import is_op_node
from graphprof.passes.instrument import Clock, instrument
from graphprof.passes.records import CAPTURE, CaptureRecord
from graphprof.runtime.codegen import compile_graph
from graphprof.profile.model import GraphKind, Phase

log = logging.getLogger("graphprof")
_TORCH_DIR = os.path.dirname(torch.__file__)
_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_ROOT_PREFIX = re.compile(r"^(?:L|G)\['[^']*'\]\.?")
#: Tensor methods that read device data on the host: timed in host gaps.
HOST_READS = frozenset({"item", "numpy", "cpu", "tolist", "__bool__", "__float__", "__int__", "__index__"})


@dataclass
class Segment:
    """One compiled graph of a segmented step."""

    id: int
    kind: GraphKind
    name: str
    graph_module: torch.fx.GraphModule
    instrumented: torch.fx.GraphModule


@dataclass
class HostRead:
    """A host read of tensor data in eager code between segments."""

    method: str
    source: str
    start_ns: int
    end_ns: int


@dataclass
class StepTimeline:
    """What ran during one segmented step, in order: segment stamps and host reads."""

    events: list[tuple[int, tuple[int, ...]] | HostRead] = field(default_factory=list)


def _module_of(meta: dict[str, Any]) -> tuple[str, str]:
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    path = _ROOT_PREFIX.sub("", str(path)).replace("['", ".").replace("']", "")
    name = mtype.__name__ if isinstance(mtype, type) else str(mtype).rsplit(".", 1)[-1].strip("'>")
    return path, name


def _frames(meta: dict[str, Any]) -> list[tuple[str, int]]:
    return [(f, int(line)) for f, line in _FRAME.findall(meta.get("stack_trace") or "")]


def _source_of(frames: list[tuple[str, int]]) -> str:
    for filename, line in reversed(frames):
        if not filename.startswith(_TORCH_DIR):
            try:
                filename = os.path.relpath(filename)
            except ValueError:
                pass
            return f"{filename}:{line}"
    return ""


def write_capture_records(gm: torch.fx.GraphModule, kind: GraphKind) -> None:
    """A CaptureRecord on every op node, from AOTAutograd's node metadata."""
    for node in gm.graph.nodes:
        if not is_op_node(node):
            continue
        module, module_type = _module_of(node.meta)
        frames = _frames(node.meta)
        if kind is GraphKind.FORWARD:
            phase = Phase.FORWARD
        elif kind is GraphKind.BACKWARD:
            phase = Phase.BACKWARD
        elif any(f.startswith(_OPTIM_DIR) for f, _ in frames):
            phase = Phase.OPTIMIZER
        else:
            phase = Phase.FORWARD if module else Phase.OTHER
        node.meta[CAPTURE] = CaptureRecord(module, module_type, _source_of(frames), phase, "")


class SegmentedCapture:
    """A torch.compile'd version of a function whose segments graphprof times."""

    def __init__(self, fn: Callable[..., Any], prepare: Callable[[torch.fx.GraphModule], None],
                 clock: Clock) -> None:
        self.segments: list[Segment] = []
        self.probing = False
        self.compiled_once = False
        self.timeline = StepTimeline()
        self._prepare = prepare
        self._clock = clock
        backend = aot_autograd(
            fw_compiler=self._compiler(GraphKind.FORWARD),
            bw_compiler=self._compiler(GraphKind.BACKWARD),
            inference_compiler=self._compiler(GraphKind.SEGMENT),
        )
        self.compiled = torch.compile(fn, backend=backend, dynamic=False)

    def _compiler(self, kind: GraphKind) -> Callable[[torch.fx.GraphModule, Any], Any]:
        def compile_segment(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            write_capture_records(gm, kind)
            self._prepare(gm)
            segment = Segment(len(self.segments), kind, f"segment {len(self.segments)} {kind.value}",
                              gm, instrument(gm, self._clock))
            self.segments.append(segment)
            if self.compiled_once:
                log.info("graphprof: compiled %s (%d ops) after the first call: a recompile or a new path",
                         segment.name, sum(1 for n in gm.graph.nodes if is_op_node(n)))
            return self._runner(segment)

        return compile_segment

    def _runner(self, segment: Segment) -> Callable[[list], Any]:
        plain, probed = compile_graph(segment.graph_module), compile_graph(segment.instrumented)
        seg_id = segment.id

        def run(args: list) -> Any:
            if not self.probing:
                return plain(*args)
            hook = sys.getprofile()
            sys.setprofile(None)  # host-read watching is for eager code only
            try:
                out, stamps = probed(*args)
            finally:
                sys.setprofile(hook)
            self.timeline.events.append((seg_id, stamps))
            return out

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled function; with ``probing`` set, record its timeline."""
        if not self.probing:
            try:
                return self.compiled(*args, **kwargs)
            finally:
                self.compiled_once = True
        self.timeline = StepTimeline()
        watcher = _HostReadWatcher(self.timeline, self._clock)
        previous = sys.getprofile()
        sys.setprofile(watcher)
        try:
            return self.compiled(*args, **kwargs)
        finally:
            sys.setprofile(previous)


class _HostReadWatcher:
    """``sys.setprofile`` hook timing host reads of tensors in eager code."""

    def __init__(self, timeline: StepTimeline, clock: Clock) -> None:
        self.timeline = timeline
        self.clock = clock
        self.open: dict[int, tuple[str, str, int]] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            name = getattr(arg, "__name__", "")
            if name in HOST_READS and isinstance(getattr(arg, "__self__", None), torch.Tensor):
                self.open[id(arg)] = (name, _frame_source(frame), self.clock())
        elif event in ("c_return", "c_exception") and self.open:
            started = self.open.pop(id(arg), None)
            if started is not None:
                name, source, t0 = started
                self.timeline.events.append(HostRead(name, source, t0, self.clock()))


def _frame_source(frame: Any) -> str:
    """``file:line`` of the innermost user frame (dynamo may make the call for the user)."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return ""
    filename = frame.f_code.co_filename
    try:
        filename = os.path.relpath(filename)
    except ValueError:
        pass
    return f"{filename}:{frame.f_lineno}"
