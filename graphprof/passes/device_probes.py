"""The device-probe pass: device event marks between the op nodes of an instrumented graph.

On an accelerator an op returns as soon as its kernels are queued, so the
host probes of the instrument pass measure dispatch, not execution. A device
mark records a timed event on the current stream; the device stamps it when
it reaches it in the queue, so the time between two marks is what the device
spent on the ops between them. A mark only enqueues an event: it launches no
kernel, touches no tensor and changes nothing the graph computes.

Two layouts, one per timing mode:

- **pipelined** (``end_mark`` is None): one mark before the first op (ahead of
  the first host probe) and one right after every op: ``N + 1`` events per
  step, node ``i`` spans events ``i`` and ``i + 1``. Ops overlap with the
  host as in an unprofiled run; a node's device time is the device's time
  between the end of the previous op and the end of this one (its kernels,
  plus any wait for the host to launch them).
- **isolated** (``end_mark`` given): ``mark`` right before every op and
  ``end_mark`` (which records and then synchronises) right after it: ``2N``
  events, node ``i`` spans events ``2i`` and ``2i + 1``. Nothing overlaps;
  the device time is the op alone (plus its launch latency on an idle
  device).

The pass only places calls; what a mark does (and how it is faked in tests)
is the runtime's business (``graphprof.runtime.device_clock``).
"""

from __future__ import annotations

from typing import Callable

import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import ANNOTATION, PROBE, ProbeRecord

Mark = Callable[[], None]


def timed_op_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The annotated op nodes of an (instrumented) graph, in execution order; probes excluded."""
    return [n for n in gm.graph.nodes if is_op_node(n) and PROBE not in n.meta and ANNOTATION in n.meta]


def event_pairs(nodes: int, isolated: bool) -> list[tuple[int, int]]:
    """(start event, end event) of every op node under a layout: what the runtime reads."""
    if isolated:
        return [(2 * i, 2 * i + 1) for i in range(nodes)]
    return [(i, i + 1) for i in range(nodes)]


def event_count(nodes: int, isolated: bool) -> int:
    """Events recorded per step: ``2N`` isolated, ``N + 1`` pipelined (none without op nodes)."""
    if nodes == 0:
        return 0
    return 2 * nodes if isolated else nodes + 1


def add_device_marks(gm: torch.fx.GraphModule, mark: Mark, end_mark: Mark | None = None) -> int:
    """Insert device marks into the instrumented graph ``gm`` in place; returns the marks per step.

    ``mark`` and ``end_mark`` must be plain functions (fx names call targets
    in its generated code). Each inserted node carries a ``ProbeRecord``
    (``slot`` = its event's index, ``after`` = the op it follows, "" for
    none) so passes that skip probes skip marks too. A mark goes directly
    after its op, ahead of any allocator read and of the host probe, so
    host-side work never sits between an op and its event.
    """
    ops = timed_op_nodes(gm)
    if not ops:
        return 0
    graph = gm.graph
    slot = 0

    def place(fn: Mark, after: str) -> None:
        nonlocal slot
        node = graph.call_function(fn, ())
        node.meta[PROBE] = ProbeRecord(slot=slot, after=after)
        slot += 1

    if end_mark is None:
        first = _first_host_probe(gm) or ops[0]
        with graph.inserting_before(first):
            place(mark, "")
        for op in ops:
            with graph.inserting_after(op):
                place(mark, op.name)
    else:
        previous = ""
        for op in ops:
            with graph.inserting_before(op):
                place(mark, previous)
            with graph.inserting_after(op):
                place(end_mark, op.name)
            previous = op.name
    graph.lint()
    gm.recompile()
    return slot


def _first_host_probe(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The instrument pass's slot-0 probe (the stamp before the first op), if any."""
    for node in gm.graph.nodes:
        record = node.meta.get(PROBE)
        if record is not None and record.slot == 0 and record.after == "":
            return node
    return None
