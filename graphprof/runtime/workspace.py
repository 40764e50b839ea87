"""Kernel workspace: memory an op allocates and frees inside one call.

Why measured, not modelled: oneDNN convolutions and batch norms (and other
kernels) allocate scratch buffers (reordered copies of inputs and weights,
a second output buffer) and free them before they return. Shapes do not say
how much, so the memory pass cannot know it; the allocator can.

How: once, during the first replayed call of a captured step (a real step
of the user's program, never an extra one), the plain graph runs under
``torch.profiler.profile(activities=[CPU], profile_memory=True)``. Its
top-level aten events occur in the graph's node order; each is matched to
the next op node that dispatches an aten op (``operator.getitem`` and
Python scalar arithmetic produce no event), checking the names. Inside a
matched event, allocations whose free (same address) also happens inside it
are the node's workspace: ``peak_bytes`` is the most of them outstanding at
once, ``allocated_bytes`` their total. If the events do not line up with
the nodes, nothing is recorded (a debug line says why): a guess would put
memory on the wrong node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch.profiler import ProfilerActivity, profile

from graphprof.passes.annotate import is_op_node

log = logging.getLogger("graphprof")


@dataclass(frozen=True)
class Workspace:
    """Transient bytes of one node's call: the peak outstanding and the total allocated."""

    peak_bytes: int
    allocated_bytes: int


def _event_type() -> Any:
    from torch._C._profiler import _EventType  # private, but the only per-event allocation record

    return _EventType


def _allocations(event: Any, allocation_tag: Any) -> list[tuple[int, int, int]]:
    """(time ns, signed bytes, address) of every CPU allocation event under ``event``."""
    out: list[tuple[int, int, int]] = []
    stack = [event]
    while stack:
        node = stack.pop()
        if node.tag == allocation_tag:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                out.append((node.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
            continue
        stack.extend(node.children)
    out.sort(key=lambda e: e[0])
    return out


def transient(events: Iterable[tuple[int, int, int]]) -> Workspace:
    """The workspace in one op's allocation events: allocations freed inside the op.

    ``events`` are (time, signed bytes, address) in time order; an allocation
    is transient when a free of the same address follows it in ``events``.
    """
    events = list(events)
    open_at: dict[int, int] = {}
    paired: set[int] = set()
    for i, (_, nbytes, ptr) in enumerate(events):
        if nbytes > 0:
            open_at[ptr] = i
        elif ptr in open_at:
            paired.update((open_at.pop(ptr), i))
    outstanding = peak = total = 0
    for i in sorted(paired):
        nbytes = events[i][1]
        outstanding += nbytes
        peak = max(peak, outstanding)
        total += max(nbytes, 0)
    return Workspace(peak, total)


def _emits_event(node: torch.fx.Node) -> bool:
    """Whether running ``node`` dispatches an aten op the profiler records at top level."""
    return is_op_node(node) and isinstance(node.target, torch._ops.OpOverload)


def attribute(gm: torch.fx.GraphModule, roots: list[Any]) -> dict[str, Workspace] | None:
    """Workspace per node name from the profiler's top-level events, or None if they do not match."""
    tags = _event_type()
    ops = [r for r in sorted(roots, key=lambda r: r.start_time_ns) if r.tag == tags.TorchOp]
    nodes = [n for n in gm.graph.nodes if _emits_event(n)]
    if len(ops) != len(nodes):
        log.debug("graphprof: workspace not recorded: %d top-level aten events for %d op nodes",
                  len(ops), len(nodes))
        return None
    out: dict[str, Workspace] = {}
    for node, event in zip(nodes, ops):
        expected = node.target._schema.name  # type: ignore[union-attr]
        if event.name != expected:
            log.debug("graphprof: workspace not recorded: node %s (%s) met profiler event %s",
                      node.name, expected, event.name)
            return None
        ws = transient(_allocations(event, tags.Allocation))
        if ws.allocated_bytes:
            out[node.name] = ws
    return out


def measure_workspace(gm: torch.fx.GraphModule, run: Callable[[], Any]) -> tuple[Any, dict[str, Workspace] | None]:
    """Run ``run()`` (one real execution of ``gm``) under torch.profiler; its result and the workspace.

    The workspace is None when it could not be attributed, or when a
    profiler is already running (the user's own: profilers do not nest).
    """
    if torch.autograd.profiler._is_profiler_enabled:
        log.debug("graphprof: workspace not recorded: a profiler is already running")
        return run(), None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    try:
        roots = list(prof.profiler.kineto_results.experimental_event_tree())
    except (AttributeError, RuntimeError) as exc:  # a torch without the event tree
        log.debug("graphprof: workspace not recorded: %s", exc)
        return result, None
    return result, attribute(gm, roots)
