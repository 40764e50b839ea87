"""Profiles of segmented steps: one GraphRecord per segment, plus host time.

A segmented step's timeline interleaves segment runs (their probe stamps)
with eager host code. Per step, each segment's node times are summed over
its runs (0 when it did not run, e.g. the other side of a branch). Host time
becomes nodes of a "host" graph: one gap node per boundary between segments
(``start → segment 0 forward``, ...), labelled with the source line where
the previous segment ends, and one node per host read of tensor data
(``item``, ``numpy``, ``cpu``, ``tolist``) at its source line. Gap nodes hold
the boundary's time minus the host reads inside it, so segments, gaps and
reads add up to the step's wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from graphprof.capture.segmented import HostRead, Segment
from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import CAPTURE
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, Phase
from graphprof.runtime.collect import graph_record_from_times

#: Nanoseconds per second. Times are ``ns / _NS_PER_S``: a division is correctly
#: rounded, so it gives the same float as the saved 0.1 ns ticks divided back,
#: and a profile survives save and load unchanged (``ns * 1e-9`` would not).
_NS_PER_S = 1e9


@dataclass(frozen=True)
class SegmentedStep:
    """One profiled call of a segmented function."""

    index: int
    start_ns: int
    end_ns: int
    events: tuple[tuple[int, tuple[int, ...]] | HostRead, ...]

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def graph_ns(self) -> int:
        return sum(ev[1][-1] - ev[1][0] for ev in self.events if isinstance(ev, tuple) and ev[1])


def _last_source(segment: Segment) -> str:
    for node in reversed(list(segment.graph_module.graph.nodes)):
        record = node.meta.get(CAPTURE) if is_op_node(node) else None
        if record is not None and record.source:
            return record.source
    return ""


def segment_graph_records(segments: Sequence[Segment], steps: Sequence[SegmentedStep]) -> list[GraphRecord]:
    """GraphRecords of the segments that ran in ``steps``, then the host graph."""
    ran = sorted({ev[0] for s in steps for ev in s.events if isinstance(ev, tuple)})
    records = []
    for seg_id in ran:
        segment = segments[seg_id]
        n_ops = sum(1 for n in segment.graph_module.graph.nodes if is_op_node(n))
        per_step = []
        for step in steps:
            times = [0] * n_ops
            for ev in step.events:
                if isinstance(ev, tuple) and ev[0] == seg_id:
                    stamps = ev[1]
                    for i in range(n_ops):
                        times[i] += stamps[i + 1] - stamps[i]
            per_step.append(times)
        records.append(graph_record_from_times(segment.graph_module, per_step, seg_id, segment.name, segment.kind))
    records.append(host_graph_record(segments, steps, graph_id=len(segments)))
    return records


def host_graph_record(segments: Sequence[Segment], steps: Sequence[SegmentedStep], graph_id: int) -> GraphRecord:
    """Host gaps and host reads between segments, per step."""
    keys: dict[tuple, int] = {}
    meta: list[tuple[str, str, str, str]] = []  # name, op, type, source
    per_step: list[dict[int, int]] = []

    def slot(key: tuple, name: str, op: str, op_type: str, source: str) -> int:
        if key not in keys:
            keys[key] = len(meta)
            meta.append((name, op, op_type, source))
        return keys[key]

    for step in steps:
        times: dict[int, int] = {}
        cursor, prev, reads = step.start_ns, None, 0

        def close_gap(until: int, nxt: str) -> None:
            label = segments[prev].name if prev is not None else "call start"
            source = _last_source(segments[prev]) if prev is not None else ""
            i = slot(("gap", prev, nxt), f"host gap: {label} -> {nxt}", "host.gap", "host_gap", source)
            times[i] = times.get(i, 0) + max(0, until - cursor - reads)

        for ev in step.events:
            if isinstance(ev, HostRead):
                i = slot(("read", ev.method, ev.source), f"Tensor.{ev.method}() at {ev.source}",
                         f"Tensor.{ev.method}", ev.method, ev.source)
                times[i] = times.get(i, 0) + (ev.end_ns - ev.start_ns)
                reads += ev.end_ns - ev.start_ns
                continue
            seg_id, stamps = ev
            close_gap(stamps[0], segments[seg_id].name)
            cursor, prev, reads = stamps[-1], seg_id, 0
        close_gap(step.end_ns, "call end")
        per_step.append(times)
    nodes = tuple(
        NodeRecord(id=i, name=name, op=op, type=op_type, source=source, phase=Phase.OTHER,
                   host_time_s=tuple(t.get(i, 0) / _NS_PER_S for t in per_step))
        for i, (name, op, op_type, source) in enumerate(meta)
    )
    return GraphRecord(id=graph_id, name="host", kind=GraphKind.HOST, nodes=nodes)
