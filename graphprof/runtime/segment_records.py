"""Profiles of segmented steps: one GraphRecord per segment and optimizer graph, plus host time.

A segmented step's timeline interleaves segment runs (their probe stamps),
optimizer runs (the stamps of the optimizer's whole-step graph), compiles
and eager host code. Per step, each graph's node times are summed over its
runs (0 when it did not run, e.g. the other side of a branch). Host time
becomes nodes of a "host" graph: one gap node per boundary between graphs
(``call start -> forward 1``, ...), labelled with the source line where the
previous graph ends, one node per host read of tensor data (``item``,
``numpy``, ``cpu``, ``tolist``) at its source line, and one per optimizer
run that was not profiled (its warm-up or an eager fallback). Gap nodes hold
the boundary's time minus the host reads, compiles and blocking FSDP2
collectives inside it (those are nodes of the "comm" graph). Compile
time (dynamo, or an optimizer's capture) is not the user's work: it is left
out of the step's wall time and reported as recompiles instead. So graphs,
gaps, reads and blocking collectives add up to the step's wall time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from graphprof.capture.segment_nodes import last_source
from graphprof.capture.host_reads import HostRead
from graphprof.capture.segment_timeline import CompileSpan, OptimizerRun, Segment
from graphprof.passes.annotate import is_op_node
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, Phase
from graphprof.runtime.collect import graph_record_from_times
from graphprof.runtime.fsdp_comm import CollectiveEvent


@dataclass(frozen=True)
class SegmentedStep:
    """One profiled call of a segmented function."""

    index: int
    start_ns: int
    end_ns: int
    events: tuple[Any, ...]

    @property
    def compile_ns(self) -> int:
        return sum(ev.end_ns - ev.start_ns for ev in self.events if isinstance(ev, CompileSpan))

    @property
    def wall_ns(self) -> int:
        """The call's time without compiling: the step the user's code runs, every call."""
        return self.end_ns - self.start_ns - self.compile_ns

    @property
    def graph_ns(self) -> int:
        total = 0
        for ev in self.events:
            stamps = ev[1] if isinstance(ev, tuple) else ev.stamps if isinstance(ev, OptimizerRun) else ()
            if stamps:
                total += stamps[-1] - stamps[0]
        return total


def compute_intervals(step: SegmentedStep) -> list[tuple[int, int]]:
    """(start, end) clock readings of every graph run of the step: its computation, for overlap."""
    out = []
    for ev in step.events:
        stamps = ev[1] if isinstance(ev, tuple) else ev.stamps if isinstance(ev, OptimizerRun) else ()
        if stamps:
            out.append((stamps[0], stamps[-1]))
    return out


def _node_times(n_ops: int, runs: list[tuple[int, ...]]) -> list[int]:
    times = [0] * n_ops
    for stamps in runs:
        for i in range(n_ops):
            times[i] += stamps[i + 1] - stamps[i]
    return times


def _n_ops(gm: Any) -> int:
    return sum(1 for n in gm.graph.nodes if is_op_node(n))


def _optimizer_graphs(steps: Sequence[SegmentedStep]) -> list[tuple[int, Any]]:
    """(slot, graph module) of every profiled optimizer graph, in order of first run."""
    seen: dict[tuple[int, int], tuple[int, Any]] = {}
    for step in steps:
        for ev in step.events:
            if isinstance(ev, OptimizerRun) and ev.stamps and ev.graph_module is not None:
                seen.setdefault((ev.slot, id(ev.graph_module)), (ev.slot, ev.graph_module))
    return list(seen.values())


def _with_update_modules(record: GraphRecord) -> GraphRecord:
    """Scalar arithmetic of a single-tensor update (bias corrections of Python numbers) and the reads of a
    gradient carry no module: they serve the parameter update that follows, so they get its module."""
    nodes = list(record.nodes)
    module, module_type = "", ""
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if node.module_type:
            module, module_type = node.module, node.module_type
        elif module_type:
            nodes[i] = replace(node, module=module, module_type=module_type)
    return replace(record, nodes=tuple(nodes))


def _optimizer_name(slot: int, slots: set[int]) -> str:
    return "optimizer" if slots == {0} else f"optimizer {slot + 1}"


def segment_graph_records(segments: Sequence[Segment], steps: Sequence[SegmentedStep]) -> list[GraphRecord]:
    """GraphRecords of the segments and optimizer graphs that ran in ``steps``, then the host graph."""
    ran = sorted({ev[0] for s in steps for ev in s.events if isinstance(ev, tuple)})
    records = []
    for seg_id in ran:
        segment = segments[seg_id]
        n_ops = _n_ops(segment.graph_module)
        per_step = [_node_times(n_ops, [ev[1] for ev in step.events if isinstance(ev, tuple) and ev[0] == seg_id])
                    for step in steps]
        records.append(graph_record_from_times(segment.graph_module, per_step, seg_id, segment.name, segment.kind))
    optimizer_graphs = _optimizer_graphs(steps)
    slots = {slot for slot, _ in optimizer_graphs}
    names: dict[int, str] = {}
    for k, (slot, gm) in enumerate(optimizer_graphs):
        n_ops = _n_ops(gm)
        per_step = [_node_times(n_ops, [ev.stamps for ev in step.events if isinstance(ev, OptimizerRun)
                                        and ev.graph_module is gm and ev.stamps]) for step in steps]
        name = _optimizer_name(slot, slots)
        if name in names.values():
            name = f"{name} (graph {k + 1})"
        names[id(gm)] = name
        record = graph_record_from_times(gm, per_step, len(segments) + k, name, GraphKind.SEGMENT)
        records.append(_with_update_modules(record))
    records.append(host_graph_record(segments, steps, len(segments) + len(optimizer_graphs), names, slots))
    return records


def host_graph_record(segments: Sequence[Segment], steps: Sequence[SegmentedStep], graph_id: int,
                      optimizer_names: dict[int, str] | None = None, slots: set[int] | None = None) -> GraphRecord:
    """Host gaps, host reads and unprofiled optimizer runs between graphs, per step."""
    optimizer_names = optimizer_names or {}
    slots = slots or set()
    keys: dict[tuple, int] = {}
    meta: list[tuple[str, str, str, str]] = []  # name, op, type, source
    per_step: list[dict[int, int]] = []

    def slot(key: tuple, name: str, op: str, op_type: str, source: str) -> int:
        if key not in keys:
            keys[key] = len(meta)
            meta.append((name, op, op_type, source))
        return keys[key]

    def label(ev: Any) -> tuple[str, str]:
        """Name of a graph run on the timeline, and the source line where it ends."""
        if isinstance(ev, OptimizerRun):
            return optimizer_names.get(id(ev.graph_module), _optimizer_name(ev.slot, slots | {ev.slot})), ""
        segment = segments[ev[0]]
        return segment.name, last_source(segment.graph_module)

    for step in steps:
        times: dict[int, int] = {}
        cursor, prev, prev_source, excluded = step.start_ns, "call start", "", 0

        def close_gap(until: int, nxt: str) -> None:
            i = slot(("gap", prev, nxt), f"host gap: {prev} -> {nxt}", "host.gap", "host_gap", prev_source)
            times[i] = times.get(i, 0) + max(0, until - cursor - excluded)

        for ev in step.events:
            if isinstance(ev, CollectiveEvent):  # a blocking collective between graphs: a node of the comm graph
                excluded += ev.done_ns - ev.launch_ns
                continue
            if isinstance(ev, (HostRead, CompileSpan)) or (isinstance(ev, OptimizerRun) and not ev.stamps):
                excluded += ev.end_ns - ev.start_ns
                if isinstance(ev, HostRead):
                    i = slot(("read", ev.method, ev.source), f"Tensor.{ev.method}() at {ev.source}",
                             f"Tensor.{ev.method}", ev.method, ev.source)
                elif isinstance(ev, OptimizerRun):
                    name = _optimizer_name(ev.slot, slots | {ev.slot})
                    i = slot(("eager optimizer", ev.slot), f"{name} (unprofiled run: warm-up or eager)",
                             "optimizer.eager", "optimizer_eager", "")
                else:
                    continue  # compile time: left out of the step
                times[i] = times.get(i, 0) + (ev.end_ns - ev.start_ns)
                continue
            stamps = ev.stamps if isinstance(ev, OptimizerRun) else ev[1]
            name, source = label(ev)
            close_gap(stamps[0], name)
            cursor, prev, prev_source, excluded = stamps[-1], name, source, 0
        close_gap(step.end_ns, "call end")
        per_step.append(times)
    nodes = tuple(
        NodeRecord(id=i, name=name, op=op, type=op_type, source=source, phase=Phase.OTHER,
                   host_time_ns=tuple(t.get(i, 0) for t in per_step))
        for i, (name, op, op_type, source) in enumerate(meta)
    )
    return GraphRecord(id=graph_id, name="host", kind=GraphKind.HOST, nodes=nodes)
