"""The Chrome/Perfetto trace written straight to a file, event by event.

The layout, the events and their args are those ``render.chrome_trace``
documents; this module is the one place they are made. Why text rather than
a dict handed to ``json.dumps``: a 100,000-node profile of 5 steps makes a
million events (one per node per step, and a live-memory counter after
each); building a dict per event and encoding them all took 30 s and held
the whole document twice in memory. Here every part of an event that no step
changes (name, track, the node's static args, its memory counter's series)
is encoded once per node, and an event is that text with the step's numbers
put in; the text goes to the file a few thousand events at a time. The bytes
are what ``json.dumps(doc, separators=(",", ":"))`` wrote before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import IO, Any

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.node_time import node_samples_s
from graphprof.profile.merge import graph_ranks, rank_info
from graphprof.profile.model import NodeRecord, Profile
from graphprof.render.labels import bound_of, shapes_text

PID = 1
STEP_TID = 0
_US = 1e6
CRITICAL_CNAME = "terrible"
#: Events per write.
CHUNK_EVENTS = 4000


_json = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def _metadata(name: str, tid: int, value: str, sort_index: int | None = None, pid: int = PID) -> list[dict[str, Any]]:
    events = [{"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": value}}]
    if sort_index is not None:
        events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                       "args": {"sort_index": sort_index}})
    return events


class _Texts:
    """JSON text of the values node events repeat, each encoded once (names, shapes, dtypes, series)."""

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.shapes: dict[tuple, str] = {}
        self.dtypes: dict[tuple, str] = {}
        self.series: dict[tuple, str] = {}

    def string(self, text: str) -> str:
        out = self.strings.get(text)
        if out is None:
            out = self.strings[text] = encode_basestring_ascii(text)  # what json.dumps writes for a str
        return out

    def shape_list(self, shapes: tuple) -> str:
        out = self.shapes.get(shapes)
        if out is None:
            out = self.shapes[shapes] = encode_basestring_ascii(shapes_text(shapes, limit=8))
        return out

    def dtype_list(self, dtypes: tuple) -> str:
        out = self.dtypes.get(dtypes)
        if out is None:
            out = self.dtypes[dtypes] = encode_basestring_ascii(", ".join(d or "-" for d in dtypes))
        return out

    def memory_series(self, node: NodeRecord) -> str | None:
        memory = node.memory
        if memory is None:
            return None
        key = (tuple(memory.live_by_category_bytes.items()), memory.live_bytes)
        out = self.series.get(key)
        if out is None:
            series = {str(k): int(v) for k, v in key[0]} or {"live": memory.live_bytes}
            out = self.series[key] = _json(series)
        return out


def _count(value: Any) -> str:
    return "null" if value is None else str(value) if type(value) is int else _json(value)


def _static_text(texts: _Texts, graph_name: str, node: NodeRecord, critical: bool, pid: int,
                 tid: int) -> tuple[str, str, str, str]:
    """The parts of a node's event no step changes: before ``ts``, between ``dur`` and ``step``, after ``step``
    (the static args), and the end (with the critical-path colour). Key order is the documented one."""
    s = texts.string
    phase = s(node.phase.value)
    start = f'{{"name":{s(node.type)},"cat":{phase},"ph":"X","ts":'
    middle = (f',"pid":{pid},"tid":{tid},"args":{{"graph":{graph_name},"node":{_count(node.id)},'
              f'"name":{s(node.name)},"op":{s(node.op)},"step":')
    tail = (f',"module":{s(node.module)},"module_type":{s(node.module_type)},"source":{s(node.source)},'
            f'"phase":{phase},"scope":{s(node.scope)},"in_shapes":{texts.shape_list(node.in_shapes)},'
            f'"out_shapes":{texts.shape_list(node.out_shapes)},"in_dtypes":{texts.dtype_list(node.in_dtypes)},'
            f'"flops":{_count(node.flops)},"bytes_read":{_count(node.bytes_read)},'
            f'"bytes_written":{_count(node.bytes_written)},"critical_path":{"true" if critical else "false"}')
    end = f'}},"cname":"{CRITICAL_CNAME}"}}' if critical else "}}"
    return start, middle, tail, end


def _finite(values: Any) -> None:
    if not all(map(math.isfinite, values)):
        raise ValueError("Out of range float values are not JSON compliant")


def write_chrome_trace(profile: Profile, f: IO[str], stat: str = "median",
                       bounds: Mapping[Any, str] | None = None) -> None:
    """Write the trace of ``profile`` to ``f`` (the layout in ``render.chrome_trace``)."""
    critical = {cp.graph_id: cp.node_set for cp in critical_paths(profile, stat=stat)}
    tracks: dict[tuple[int, str], int] = {}
    for graph in profile.graphs:
        for node in graph.nodes:
            tracks.setdefault((graph.id, node.phase.value), len(tracks) + 1)
    names = {g.id: g.name or f"graph {g.id}" for g in profile.graphs}
    # One process per rank in a merged distributed profile (pid = rank + 1), else one process.
    pid_of = {gid: rank + 1 for gid, rank in graph_ranks(profile).items()}
    info = rank_info(profile)
    rank_walls = {int(r["rank"]) + 1: r.get("wall_time_s", []) for r in info.ranks
                  } if pid_of and info is not None else {}
    pids = sorted(set(pid_of.values())) or [PID]
    head: list[dict[str, Any]] = []
    for pid in pids:
        label = f"rank {pid - 1}: " if pid_of else ""
        head += _metadata("process_name", STEP_TID, f"graphprof: {label}{profile.meta.function or 'profile'}", pid=pid)
        if pid_of:
            head.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": STEP_TID,
                         "args": {"sort_index": pid}})
        head += _metadata("thread_name", STEP_TID, "steps", 0, pid=pid)
    for (graph_id, phase), tid in tracks.items():
        head += _metadata("thread_name", tid, f"{names[graph_id]} · {phase}", tid, pid=pid_of.get(graph_id, PID))
    f.write('{"traceEvents":[' + ",".join(map(_json, head)))

    samples = {(g.id, n.id): node_samples_s(n) for g in profile.graphs for n in g.nodes}
    for times in samples.values():
        _finite(times)
    _finite(s.wall_time_s for s in profile.steps)
    allocator = {(g.id, r.step, r.node_id): r for g in profile.graphs for r in getattr(g, "device_memory", ())}
    n_steps = max([len(s) for s in samples.values()] + [len(profile.steps)], default=0)
    # Per graph, per node: (samples, static text, memory series, flops, bytes moved or None, bound text).
    plan = []
    texts = _Texts()
    for graph in profile.graphs:
        graph_name = _json(graph.name)
        cp = critical.get(graph.id, frozenset())
        pid = pid_of.get(graph.id, PID)
        rows = []
        for node in graph.nodes:
            moved = None if node.bytes_read is None and node.bytes_written is None else \
                (node.bytes_read or 0) + (node.bytes_written or 0)
            bound = bound_of(bounds, graph.id, node.id)
            rows.append((node.id, samples[(graph.id, node.id)],
                         _static_text(texts, graph_name, node, node.id in cp, pid, tracks[(graph.id, node.phase.value)]),
                         texts.memory_series(node), node.flops, moved,
                         "" if bound is None else ',"bound":' + _json(bound)))
        plan.append((graph, pid, rows))
    counter_head = '{"name":"live memory (bytes)","ph":"C","ts":'
    offset_us = 0.0
    chunk: list[str] = [""]  # "" puts the comma between the metadata and the first event
    for k in range(n_steps):
        step_index = profile.steps[k].index if k < len(profile.steps) else k
        cursor = {pid: offset_us for pid in pids}
        for graph, pid, rows in plan:
            t_us = cursor[pid]
            counter_tail = f',"pid":{pid},"tid":{STEP_TID},"args":'
            for node_id, times, (start, middle, tail, end), series, flops, moved, bound in rows:
                if k >= len(times):
                    continue
                time_s = times[k]
                dur_us = time_s * _US
                rates = ""
                if time_s > 0:
                    if flops is not None:
                        rates = f',"flop_per_s":{flops / time_s!r}'
                    if moved is not None:
                        rates += f',"bandwidth_bytes_per_s":{moved / time_s!r}'
                chunk.append(f"{start}{t_us!r},\"dur\":{dur_us!r}{middle}{step_index}{tail}{rates}{bound}{end}")
                t_us += dur_us
                if series is not None:
                    chunk.append(f"{counter_head}{t_us!r}{counter_tail}{series}}}")
                read = allocator.get((graph.id, step_index, node_id)) if allocator else None
                if read is not None:
                    chunk.append(_json({"name": "device memory (bytes)", "ph": "C", "ts": t_us, "pid": pid,
                                        "tid": STEP_TID,
                                        "args": {"allocated": read.allocated_bytes, "reserved": read.reserved_bytes}}))
                if len(chunk) >= CHUNK_EVENTS:
                    f.write(",".join(chunk))
                    chunk = [""]
            cursor[pid] = t_us
        wall_us = profile.steps[k].wall_time_s * _US if k < len(profile.steps) else 0.0
        longest_us = 0.0
        for pid in pids:
            own = rank_walls.get(pid, [])
            pid_wall_us = own[k] * _US if k < len(own) else wall_us
            span_us = max(pid_wall_us, cursor[pid] - offset_us)
            longest_us = max(longest_us, span_us)
            chunk.append(_json({"name": f"step {step_index}", "cat": "step", "ph": "X", "ts": offset_us, "dur": span_us,
                                "pid": pid, "tid": STEP_TID,
                                "args": {"step": step_index, "wall_time_s": pid_wall_us / _US,
                                         "graph_time_s": (cursor[pid] - offset_us) / _US}}))
        offset_us += longest_us
    if len(chunk) > 1:
        f.write(",".join(chunk))
    meta = profile.meta
    other = {"generator": "graphprof", "function": meta.function, "device": meta.device_type,
             "device_name": meta.device_name, "torch": meta.torch_version, "stat_for_critical_path": stat}
    f.write('],"displayTimeUnit":"ms","otherData":' + _json(other) + "}")
