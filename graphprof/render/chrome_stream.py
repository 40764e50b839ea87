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
from itertools import accumulate, chain
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import IO, Any

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.profile.merge import graph_ranks, rank_info
from graphprof.profile.model import NS_PER_S, Profile
from graphprof.render.labels import bound_of, shapes_text
from graphprof.render.node_columns import Encoded, graph_spans

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


def _count(value: Any) -> str:
    return "null" if value is None else str(value) if type(value) is int else _json(value)


def _series(item: tuple[Any, Any]) -> str | None:
    """The live-memory counter's args from (live bytes by category as items, live bytes), None without memory."""
    by_category, live = item
    if by_category is None and live is None:
        return None
    series = {str(k): int(v) for k, v in by_category or ()} or {"live": live}
    return _json(series)


def _static_texts(frame: NodeFrame, lo: int, hi: int, graph_name: str, critical: frozenset[int], pid: int,
                  track_of: dict[str, int], texts: Encoded) -> list[tuple[str, str, str, str]]:
    """Per node of ``[lo, hi)``, the parts of its event no step changes: before ``ts``, between ``dur`` and
    ``step``, after ``step`` (the static args), and the end (with the critical-path colour). Key order is
    the documented one. Each column's text is made once per distinct value."""
    col = lambda name: frame.column(name)[lo:hi]  # noqa: E731
    shapes = Encoded(lambda v: encode_basestring_ascii(shapes_text(v, limit=8)))
    dtypes = Encoded(lambda v: encode_basestring_ascii(", ".join(d or "-" for d in v)))
    string = texts.column
    phases = col("phase")
    ids = col("id")
    out = []
    for (typ, phase, nid, name, op, module, module_type, source, scope, in_shapes, out_shapes, in_dtypes, flops,
         read, written, track) in zip(
            string(col("type")), string(phases), ids, string(col("name")), string(col("op")), string(col("module")),
            string(col("module_type")), string(col("source")), string(col("scope")), shapes.column(col("in_shapes")),
            shapes.column(col("out_shapes")), dtypes.column(col("in_dtypes")), map(_count, col("flops")),
            map(_count, col("bytes_read")), map(_count, col("bytes_written")), map(track_of.__getitem__, phases)):
        on_path = nid in critical
        out.append((
            f'{{"name":{typ},"cat":{phase},"ph":"X","ts":',
            f',"pid":{pid},"tid":{track},"args":{{"graph":{graph_name},"node":{_count(nid)},"name":{name},"op":{op},'
            '"step":',
            f',"module":{module},"module_type":{module_type},"source":{source},"phase":{phase},"scope":{scope},'
            f'"in_shapes":{in_shapes},"out_shapes":{out_shapes},"in_dtypes":{in_dtypes},"flops":{flops},'
            f'"bytes_read":{read},"bytes_written":{written},"critical_path":{"true" if on_path else "false"}',
            f'}},"cname":"{CRITICAL_CNAME}"}}' if on_path else "}}"))
    return out


_COUNTER_HEAD = '{"name":"live memory (bytes)","ph":"C","ts":'
#: A node's per-step parts, column by column, for ``_block_events``.
_Block = tuple[list[tuple[float, ...]], list[str], list[str], list[str], list[str], list[str | None], list[Any],
               list[Any]]


def _blocks(rows: list[tuple]) -> list[_Block]:
    """A graph's rows (as ``write_chrome_trace`` plans them) as column blocks of ``CHUNK_EVENTS`` nodes."""
    blocks = []
    for lo in range(0, len(rows), CHUNK_EVENTS):
        part = rows[lo:lo + CHUNK_EVENTS]
        blocks.append((
            [r[1] for r in part], [r[2][0] for r in part], [r[2][1] for r in part], [r[2][2] for r in part],
            [r[6] + r[2][3] for r in part], [r[3] for r in part], [r[4] for r in part], [r[5] for r in part]))
    return blocks


def _block_events(block: _Block, k: int, step_index: int, t_us: float, counter_tail: str) -> tuple[str, float]:
    """The events of step ``k`` of a block of nodes that all have that step, laid end to end from ``t_us``:
    the same text the event-by-event loop writes, made column by column. Returns it and the end time.

    Why: a trace of 100,000 nodes over 5 steps is a million events; list comprehensions over columns
    and one ``repr`` per timestamp (a node's counter sits at the next node's start) make each cheaper.
    """
    samples, starts, middles, tails, closes, series, flops, moved = block
    times = [s[k] for s in samples]
    durs = [t * _US for t in times]
    ends = list(accumulate(durs, initial=t_us))
    stamps = list(map(repr, ends))
    if None not in flops and None not in moved:  # the usual case: every node has FLOPs and bytes
        rates = [f',"flop_per_s":{fl / t!r},"bandwidth_bytes_per_s":{mv / t!r}' if t > 0 else ""
                 for t, fl, mv in zip(times, flops, moved)]
    else:
        rates = ["" if not t > 0 else
                 (f',"flop_per_s":{fl / t!r}' if fl is not None else "")
                 + (f',"bandwidth_bytes_per_s":{mv / t!r}' if mv is not None else "")
                 for t, fl, mv in zip(times, flops, moved)]
    counter = "," + _COUNTER_HEAD  # a node's live-memory counter follows its event
    events = [f'{a}{ts},"dur":{d!r}{b}{step_index}{c}{r}{e}' if sr is None else
              f'{a}{ts},"dur":{d!r}{b}{step_index}{c}{r}{e}{counter}{te}{counter_tail}{sr}}}'
              for a, ts, te, d, b, c, r, e, sr in zip(starts, stamps, stamps[1:], durs, middles, tails, rates, closes,
                                                      series)]
    return ",".join(events), ends[-1]


def _finite(values: Any) -> None:
    if not all(map(math.isfinite, values)):
        raise ValueError("Out of range float values are not JSON compliant")


def write_chrome_trace(profile: Profile, f: IO[str], stat: str = "median",
                       bounds: Mapping[Any, str] | None = None) -> None:
    """Write the trace of ``profile`` to ``f`` (the layout in ``render.chrome_trace``)."""
    critical = {cp.graph_id: cp.node_set for cp in critical_paths(profile, stat=stat)}
    frame = node_frame(profile)
    spans = graph_spans(profile, frame)
    phases = frame.column("phase")
    tracks: dict[tuple[int, str], int] = {}
    for graph, lo, hi in spans:
        for phase in dict.fromkeys(phases[lo:hi]):
            tracks.setdefault((graph.id, phase), len(tracks) + 1)
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

    # Each node's samples in seconds (``node_samples_s``: device where recorded, else host).
    samples = [tuple([t / NS_PER_S for t in (d or h)])
               for h, d in zip(frame.column("host_time_ns"), frame.column("device_time_ns"))]
    _finite(chain.from_iterable(samples))
    _finite(s.wall_time_s for s in profile.steps)
    allocator = {(g.id, r.step, r.node_id): r for g in profile.graphs for r in getattr(g, "device_memory", ())}
    n_steps = max([len(s) for s in samples] + [len(profile.steps)], default=0)
    series = Encoded(_series).column([(None if by_category is None else tuple(by_category.items()), live) for
                                      by_category, live in zip(frame.column("live_by_category_bytes"),
                                                               frame.column("live_bytes"))])
    ids, flops_of, moved_of = frame.column("id"), frame.column("flops"), frame.column("bytes_moved")
    # Per graph, per node: (samples, static text, memory series, flops, bytes moved or None, bound text).
    plan = []
    texts = Encoded(encode_basestring_ascii)  # what json.dumps writes for a str
    for graph, lo, hi in spans:
        pid = pid_of.get(graph.id, PID)
        track_of = {phase: tid for (gid, phase), tid in tracks.items() if gid == graph.id}
        static = _static_texts(frame, lo, hi, _json(graph.name), critical.get(graph.id, frozenset()), pid,
                               track_of, texts)
        bound_text = [""] * (hi - lo)
        if bounds:
            for i in range(lo, hi):
                bound = bound_of(bounds, graph.id, ids[i])
                if bound is not None:
                    bound_text[i - lo] = ',"bound":' + _json(bound)
        rows = list(zip(ids[lo:hi], samples[lo:hi], static, series[lo:hi], flops_of[lo:hi], moved_of[lo:hi],
                        bound_text))
        has_device_memory = any(key[0] == graph.id for key in allocator)
        fewest = min(map(len, samples[lo:hi]), default=0)
        plan.append((graph, pid, rows, None if has_device_memory else _blocks(rows), fewest))
    counter_head = _COUNTER_HEAD
    offset_us = 0.0
    chunk: list[str] = [""]  # "" puts the comma between the metadata and the first event
    for k in range(n_steps):
        step_index = profile.steps[k].index if k < len(profile.steps) else k
        cursor = {pid: offset_us for pid in pids}
        for graph, pid, rows, blocks, fewest in plan:
            t_us = cursor[pid]
            counter_tail = f',"pid":{pid},"tid":{STEP_TID},"args":'
            if blocks is not None and k < fewest:  # every node has this step and no allocator sample: in blocks
                if len(chunk) > 1:
                    f.write(",".join(chunk))
                    chunk = [""]
                for block in blocks:
                    text, t_us = _block_events(block, k, step_index, t_us, counter_tail)
                    f.write("," + text)
                cursor[pid] = t_us
                continue
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
