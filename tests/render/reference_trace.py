"""The dict-per-event Chrome trace builder that ``render.chrome_stream`` replaced, kept as the oracle.

The streamed writer must give the same bytes as ``json.dumps`` of this
document; tests compare the two on real, synthetic and hostile profiles.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.node_time import node_samples_s
from graphprof.profile.merge import graph_ranks, rank_info
from graphprof.profile.model import GraphRecord, NodeRecord, Profile
from graphprof.render.labels import bound_of, shapes_text

PID = 1
STEP_TID = 0
_US = 1e6
CRITICAL_CNAME = "terrible"


def _static_args(graph: GraphRecord, node: NodeRecord, critical: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The args of a node's events that no step changes, before and after ``step`` (JSON keeps key order).

    Why: a trace repeats each node once per profiled step; formatting its
    shapes and dtypes once instead of per step is a large share of the export.
    """
    head = {"graph": graph.name, "node": node.id, "name": node.name, "op": node.op}
    tail = {
        "module": node.module, "module_type": node.module_type, "source": node.source,
        "phase": node.phase.value, "scope": node.scope,
        "in_shapes": shapes_text(node.in_shapes, limit=8), "out_shapes": shapes_text(node.out_shapes, limit=8),
        "in_dtypes": ", ".join(d or "-" for d in node.in_dtypes),
        "flops": node.flops, "bytes_read": node.bytes_read, "bytes_written": node.bytes_written,
        "critical_path": critical,
    }
    return head, tail


def _node_args(graph: GraphRecord, node: NodeRecord, time_s: float, step: int, critical: bool,
               bound: str | None, static: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    head, tail = static if static is not None else _static_args(graph, node, critical)
    args: dict[str, Any] = {**head, "step": step, **tail}
    moved = (node.bytes_read or 0) + (node.bytes_written or 0)
    if time_s > 0:
        if node.flops is not None:
            args["flop_per_s"] = node.flops / time_s
        if node.bytes_read is not None or node.bytes_written is not None:
            args["bandwidth_bytes_per_s"] = moved / time_s
    if bound is not None:
        args["bound"] = bound
    return args


def _memory_counter(node: NodeRecord, ts_us: float, pid: int = PID) -> dict[str, Any] | None:
    memory = node.memory
    if memory is None:
        return None
    series = {str(k): int(v) for k, v in memory.live_by_category_bytes.items()} or {"live": memory.live_bytes}
    return {"name": "live memory (bytes)", "ph": "C", "ts": ts_us, "pid": pid, "tid": STEP_TID, "args": series}


def _metadata(name: str, tid: int, value: str, sort_index: int | None = None, pid: int = PID) -> list[dict[str, Any]]:
    events = [{"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": value}}]
    if sort_index is not None:
        events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                       "args": {"sort_index": sort_index}})
    return events


def chrome_trace(profile: Profile, stat: str = "median", bounds: Mapping[Any, str] | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` plus ``otherData``)."""
    critical = {cp.graph_id: cp.node_set for cp in critical_paths(profile, stat=stat)}
    tracks: dict[tuple[int, str], int] = {}
    for graph in profile.graphs:
        for node in graph.nodes:
            tracks.setdefault((graph.id, node.phase.value), len(tracks) + 1)
    names = {g.id: g.name or f"graph {g.id}" for g in profile.graphs}
    # One process per rank in a merged distributed profile (pid = rank + 1), else one process.
    pid_of = {gid: rank + 1 for gid, rank in graph_ranks(profile).items()}
    rank_walls = {int(r["rank"]) + 1: r.get("wall_time_s", []) for r in (rank_info(profile) or {}).get("ranks", [])
                  } if pid_of else {}
    pids = sorted(set(pid_of.values())) or [PID]
    events: list[dict[str, Any]] = []
    for pid in pids:
        label = f"rank {pid - 1}: " if pid_of else ""
        events += _metadata("process_name", STEP_TID, f"graphprof: {label}{profile.meta.function or 'profile'}", pid=pid)
        if pid_of:
            events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": STEP_TID,
                           "args": {"sort_index": pid}})
        events += _metadata("thread_name", STEP_TID, "steps", 0, pid=pid)
    for (graph_id, phase), tid in tracks.items():
        events += _metadata("thread_name", tid, f"{names[graph_id]} · {phase}", tid, pid=pid_of.get(graph_id, PID))

    samples = {(g.id, n.id): node_samples_s(n) for g in profile.graphs for n in g.nodes}
    allocator = {(g.id, r.step, r.node_id): r for g in profile.graphs for r in getattr(g, "device_memory", ())}
    n_steps = max([len(s) for s in samples.values()] + [len(profile.steps)], default=0)
    static: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any]]] = {}
    offset_us = 0.0
    for k in range(n_steps):
        step_index = profile.steps[k].index if k < len(profile.steps) else k
        cursor = {pid: offset_us for pid in pids}
        for graph in profile.graphs:
            cp = critical.get(graph.id, frozenset())
            pid = pid_of.get(graph.id, PID)
            t_us = cursor[pid]
            last_series: list[Any] | None = None  # the series of the last counter of this graph in this step
            for node in graph.nodes:
                times = samples[(graph.id, node.id)]
                if k >= len(times):
                    continue
                dur_us = times[k] * _US
                on_path = node.id in cp
                fixed = static.get((id(graph), id(node)))
                if fixed is None:
                    fixed = static[(id(graph), id(node))] = _static_args(graph, node, on_path)
                phase = fixed[1]["phase"]
                event = {
                    "name": node.type, "cat": phase, "ph": "X", "ts": t_us, "dur": dur_us,
                    "pid": pid, "tid": tracks[(graph.id, phase)],
                    "args": _node_args(graph, node, times[k], step_index, on_path,
                                       bound_of(bounds, graph.id, node.id), fixed),
                }
                if on_path:
                    event["cname"] = CRITICAL_CNAME
                events.append(event)
                t_us += dur_us
                counter = _memory_counter(node, t_us, pid)
                if counter is not None and list(counter["args"].items()) != last_series:  # where it changes
                    events.append(counter)
                    last_series = list(counter["args"].items())
                read = allocator.get((graph.id, step_index, node.id))
                if read is not None:
                    events.append({"name": "device memory (bytes)", "ph": "C", "ts": t_us, "pid": pid, "tid": STEP_TID,
                                   "args": {"allocated": read.allocated_bytes, "reserved": read.reserved_bytes}})
            cursor[pid] = t_us
        wall_us = profile.steps[k].wall_time_s * _US if k < len(profile.steps) else 0.0
        longest_us = 0.0
        for pid in pids:
            own = rank_walls.get(pid, [])
            pid_wall_us = own[k] * _US if k < len(own) else wall_us
            span_us = max(pid_wall_us, cursor[pid] - offset_us)
            longest_us = max(longest_us, span_us)
            events.append({"name": f"step {step_index}", "cat": "step", "ph": "X", "ts": offset_us, "dur": span_us,
                           "pid": pid, "tid": STEP_TID,
                           "args": {"step": step_index, "wall_time_s": pid_wall_us / _US,
                                    "graph_time_s": (cursor[pid] - offset_us) / _US}})
        offset_us += longest_us
    meta = profile.meta
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "graphprof", "function": meta.function, "device": meta.device_type,
                      "device_name": meta.device_name, "torch": meta.torch_version, "stat_for_critical_path": stat},
    }


def reference_trace_json(profile: Profile, stat: str = "median", bounds: Mapping[Any, str] | None = None) -> str:
    return json.dumps(chrome_trace(profile, stat=stat, bounds=bounds), allow_nan=False, separators=(",", ":"))
