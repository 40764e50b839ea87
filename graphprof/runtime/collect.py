"""Build a Profile from an annotated graph and its raw samples.

This is where torch-side records (``node.meta``) become plain values: the
profile layer never sees a tensor, a node or an op overload.
"""

from __future__ import annotations

import platform
import time
from typing import Mapping, Sequence

import torch
import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import (
    ANNOTATION, ATTRS, COST, MEMORY, MEMORY_STEP, PROBE_AFTER, OpAnnotation, StepMemoryRecord,
)
from graphprof.profile.model import (
    OVERHEAD_NODE, OVERHEAD_OP, DeviceMemorySample, GraphKind, Phase, GraphRecord, MemoryPeak, MemoryRecord,
    NodeRecord, PeakTensor, Profile, ProfileMeta, StepRecord, ns_to_s,
)
from graphprof.runtime.runner import StepTiming
from graphprof.runtime.samples import StepSamples
from graphprof.runtime.workspace import Workspace



def graph_record(
    gm: torch.fx.GraphModule, steps: Sequence[StepSamples], graph_id: int = 0,
    name: str = "step", kind: GraphKind = GraphKind.STEP,
    device_memory: Sequence[DeviceMemorySample] = (),
    device_times: Sequence[Sequence[int]] | None = None,
    workspace: Mapping[str, Workspace] | None = None,
) -> GraphRecord:
    """One GraphRecord: a NodeRecord per op node, with its host time in every step.

    ``device_memory`` holds allocator samples taken on an accelerator; the
    modelled memory comes from the memory pass's records, when it ran.
    ``device_times`` (ns, one list per step in node order, from the
    device clock) become the nodes' ``device_time_ns``. ``workspace`` (node
    name -> measured kernel scratch, runtime/workspace.py) fills the memory
    records' workspace fields.
    """
    return graph_record_from_times(gm, [s.node_times_ns() for s in steps], graph_id, name, kind, device_memory,
                                   device_times, workspace)


def graph_record_from_times(
    gm: torch.fx.GraphModule, per_step: Sequence[Sequence[int]], graph_id: int,
    name: str, kind: GraphKind, device_memory: Sequence[DeviceMemorySample] = (),
    device_times: Sequence[Sequence[int]] | None = None,
    workspace: Mapping[str, Workspace] | None = None,
) -> GraphRecord:
    """A GraphRecord from per-step node times in ns (``stamps[k + 1] - stamps[k]`` at position ``k``).

    The join of samples to nodes is explicit: a node's samples sit at the slot
    of the probe after it, minus one, which the instrument pass recorded on the
    node (``PROBE_AFTER``). Graphs the instrument pass did not probe (a
    segmented run's optimizer graphs, stamped by the recorder in op order)
    have no such record; their samples sit at the node's annotation index.
    """
    workspace = workspace or {}
    ids: dict[str, int] = {}
    nodes: list[NodeRecord] = []
    for node in gm.graph.nodes:
        if not is_op_node(node):
            continue
        ann: OpAnnotation = node.meta[ANNOTATION]
        cost = node.meta.get(COST)
        mem = node.meta.get(MEMORY)
        attrs = node.meta.get(ATTRS)
        i = ann.index
        ids[node.name] = i
        probe = node.meta.get(PROBE_AFTER)
        slot = probe.slot - 1 if probe is not None else i
        ws = workspace.get(node.name, Workspace(0, 0))
        nodes.append(NodeRecord(
            id=i,
            name=node.name,
            op=ann.op,
            type=ann.type,
            inputs=tuple(ids[p] for p in ann.inputs if p in ids),
            in_shapes=tuple(t.shape for t in ann.in_tensors),
            in_dtypes=tuple(t.dtype for t in ann.in_tensors),
            out_shapes=tuple(t.shape if t else None for t in ann.out_tensors),
            out_dtypes=tuple(t.dtype if t else None for t in ann.out_tensors),
            module=ann.module,
            module_type=ann.module_type,
            source=ann.source,
            phase=ann.phase,
            scope=ann.scope,
            is_view=ann.is_view,
            is_inplace=ann.is_inplace,
            flops=cost.flops if cost else None,
            bytes_read=cost.bytes_read if cost else None,
            bytes_written=cost.bytes_written if cost else None,
            memory=MemoryRecord(mem.allocated_bytes, mem.freed_bytes, mem.live_bytes,
                                {k: v for k, v in mem.live_by_category_bytes.items() if v},
                                ws.peak_bytes, ws.allocated_bytes) if mem else None,
            host_time_ns=tuple(times[slot] for times in per_step),
            device_time_ns=tuple(times[i] for times in device_times) if device_times else (),  # by annotation index
            attrs=attrs.items if attrs else (),
        ))
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    step_memory = output.meta.get(MEMORY_STEP) if output is not None else None
    return GraphRecord(id=graph_id, name=name, kind=kind, nodes=tuple(nodes),
                       memory_peak=_memory_peak(step_memory, ids) if step_memory else None,
                       device_memory=tuple(device_memory))


def _memory_peak(record: StepMemoryRecord, ids: dict[str, int]) -> MemoryPeak:
    """The memory pass's step record with node names turned into node ids."""
    return MemoryPeak(
        node_id=ids.get(record.peak_node, -1),
        live_bytes=record.peak_bytes,
        by_category_bytes=dict(record.peak_by_category_bytes),
        largest_tensors=tuple(
            PeakTensor(t.name, t.nbytes, t.category, ids.get(t.producer, -1)) for t in record.largest_at_peak),
        start_bytes=record.start_bytes,
        allocated_bytes=record.allocated_bytes,
    )


def profile_meta(function: str, capture: str, probe_cost_s: float, peaks: dict[str, float] | None = None,
                 device_type: str = "cpu", device_name: str | None = None, **extra: object) -> ProfileMeta:
    """Meta for a profile taken now, on this host; ``peaks`` from calibration or the user.

    ``device_type`` is where the graphs ran ("cuda" on a GPU); the name
    defaults to the host processor's (right for "cpu").
    """
    from graphprof.version import __version__

    return ProfileMeta(
        function=function,
        capture=capture,
        device_type=device_type,
        device_name=device_name if device_name is not None else platform.processor() or platform.machine(),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        graphprof_version=__version__,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        probe_cost_s=probe_cost_s,
        peaks=dict(peaks or {}),
        extra=dict(extra),
    )


def build_profile(
    graphs: Sequence[GraphRecord], steps: Sequence[StepTiming], meta: ProfileMeta,
) -> Profile:
    """Assemble a Profile from graph records and step samples."""
    return Profile(
        meta=meta,
        steps=tuple(StepRecord(index=s.index, wall_time_s=ns_to_s(s.wall_ns), graph_time_s=ns_to_s(s.graph_ns))
                    for s in steps),
        graphs=tuple(graphs),
    )


def gradient_host_record(steps: Sequence[StepSamples], graph_id: int) -> GraphRecord | None:
    """The host work around a whole-step graph, as three nodes, so that every node of
    the step adds up to its wall time.

    Replay drops the previous step's ``.grad`` tensors first (what
    ``zero_grad(set_to_none=True)`` does) and assigns the new ones after the
    graph (what AccumulateGrad does); freeing and checking them takes real
    time on models with many parameters, so it is shown, not left out. The
    second node lists the first as its input: they run in sequence, and the
    critical path must see them that way. The third, ``graphprof.overhead``,
    is graphprof's own per-call work (input signature, guards, flattening
    and unflattening, keeping the samples): shown, so that no share of the
    step goes unaccounted for, and never subtracted from anything.
    """
    per_step = [s.host_times_ns() for s in steps]
    if not any(a or b for a, b in per_step):
        return None
    nodes = (
        NodeRecord(id=0, name="drop previous .grad (zero_grad)", op="host.zero_grad", type="zero_grad",
                   phase=Phase.OTHER, flops=0, bytes_read=0, bytes_written=0,
                   host_time_ns=tuple(a for a, _ in per_step)),
        NodeRecord(id=1, name="assign new .grad", op="host.assign_grad", type="assign_grad", inputs=(0,),
                   phase=Phase.BACKWARD, flops=0, bytes_read=0, bytes_written=0,
                   host_time_ns=tuple(b for _, b in per_step)),
        NodeRecord(id=2, name=OVERHEAD_NODE, op=OVERHEAD_OP, type="graphprof_overhead", inputs=(1,),
                   phase=Phase.OTHER, flops=0, bytes_read=0, bytes_written=0,
                   host_time_ns=tuple(s.overhead_ns() for s in steps)),
    )
    return GraphRecord(id=graph_id, name="host", kind=GraphKind.HOST, nodes=nodes)
