"""The Chrome/Perfetto trace written straight to a file, a few thousand events at a time.

The layout, the events and their args are those ``render.chrome_trace``
documents; this module is the one place they are made. The bytes are what
``json.dumps(doc, separators=(",", ":"))`` of a dict per event wrote before
(``tests/render/reference_trace.py`` keeps that builder as the oracle).

Why text made by columns: a 100,000-node profile of 5 steps makes a million
events (one per node per step, and a live-memory counter after each). A dict
per event took 30 s; a ``repr`` per number and an f-string per event still
4 s. Here every part of an event that no step changes (name, track, static
args, memory series) is made once, as columns (``chrome_texts.NodeTexts``:
constants, and per-node texts mostly shared between nodes), a step adds four
numbers per event (start, duration, FLOP/s, bytes/s), formatted as arrays
(``json_floats``), and the events of a block of nodes are one ``str.join``
of those columns and the numbers, interleaved by list slicing
(``_block_text``). Python code runs per block of nodes, not per event.

Graphs with device-memory reads (an extra counter after some events), steps
that not every node has, and counts beyond int64 take the event-by-event
loop (``_loop_events``), which writes the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import IO, Any

import numpy as np

from graphprof.analysis.critical_path import critical_paths
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.node_arrays import int_array
from graphprof.profile.merge import graph_ranks, rank_info
from graphprof.profile.model import NS_PER_S, GraphRecord, Profile, node_source
from graphprof.profile.node_columns import NodeColumns
from graphprof.render.chrome_texts import (
    NodeTexts, bound_texts, json_text, loaded_series_texts, node_texts, series_texts,
)
from graphprof.render.column_text import Column
from graphprof.render.export_options import Bounds
from graphprof.render.json_floats import float_texts
from graphprof.render.node_columns import graph_spans

PID = 1
STEP_TID = 0
_US = 1e6
#: Events per write.
CHUNK_EVENTS = 4000
#: Samples (ns) below this convert to float64 exactly, so array arithmetic rounds as Python's does.
_EXACT_NS = 2**53
_COUNTER_HEAD = ',{"name":"live memory (bytes)","ph":"C","ts":'
_FLOPS_KEY = ',"flop_per_s":'
_BANDWIDTH_KEY = ',"bandwidth_bytes_per_s":'

def _metadata(name: str, tid: int, value: str, sort_index: int | None = None, pid: int = PID) -> list[dict[str, Any]]:
    events = [{"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": value}}]
    if sort_index is not None:
        events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                       "args": {"sort_index": sort_index}})
    return events


def _samples_ns(graph: GraphRecord, frame: NodeFrame, lo: int, hi: int) -> tuple[np.ndarray | None, int]:
    """(the samples every node of the graph has, as int64 steps x nodes, None where they are not exact
    int64; the most samples a node has). Device samples where recorded, else host (``node_samples_s``)."""
    source = node_source(graph)
    matrix = None
    if isinstance(source, NodeColumns):  # a loaded graph keeps its samples as arrays
        matrix = source.samples_ns("device_time_ns")
        if matrix is not None and not matrix.shape[0]:
            matrix = source.samples_ns("host_time_ns")
    if matrix is not None:
        most = matrix.shape[0]
    else:
        rows = [d or h for d, h in zip(frame.column("device_time_ns")[lo:hi], frame.column("host_time_ns")[lo:hi])]
        if not rows:
            return None, 0
        fewest, most = min(map(len, rows)), max(map(len, rows))
        try:
            matrix = np.array([r[:fewest] for r in rows] if fewest < most else rows).reshape(len(rows), fewest).T
        except (OverflowError, ValueError, TypeError):
            return None, most
    if matrix.dtype != np.int64 or (matrix.size and int(np.abs(matrix).max()) >= _EXACT_NS):
        return None, most
    return matrix, most


#: The step's numbers in an event's layout (``_Blocks.layout``), by their index in ``_block_text``'s tuple.
_TS, _DUR, _STEP, _FLOPS, _MOVED, _END = range(6)


@dataclass(frozen=True)
class _Blocks:
    """What ``_block_text`` needs of a graph: an event's layout, its samples and counts as arrays, and
    which of an event's optional parts each node lacks."""

    #: An event as columns (``NodeTexts``' constants and per-node texts) and the step's numbers (an
    #: int: which), in order; the parts an event may lack each a column of their own, at ``slots``.
    layout: list[Column | int]
    #: Where the FLOP/s key, the bandwidth key and the memory counter's time stand in ``layout`` (a node
    #: without a counter has its head and args blank already: only the time, a step's number, is blanked).
    slots: tuple[int, int, int]
    #: Samples in ns, steps x nodes, of the steps every node has.
    samples_ns: np.ndarray
    #: FLOPs and bytes moved as float64 (what ``count / time_s`` divides), 0 where unknown.
    flops: np.ndarray
    moved: np.ndarray
    #: Nodes without FLOPs, without bytes moved, without a memory counter.
    no_flops: np.ndarray
    no_moved: np.ndarray
    no_counter: np.ndarray


def _blocks(texts: NodeTexts, samples_ns: np.ndarray, counts: tuple[np.ndarray, ...], lo: int, hi: int) -> _Blocks:
    """``_Blocks`` of nodes ``[lo, hi)``, from the frame's int64 FLOPs and bytes moved and where each is known."""
    flops, flops_known, moved, moved_known = (a[lo:hi] for a in counts)
    no_counter = np.array([s is None for s in texts.counter], dtype=bool)
    counter: list[str] = texts.counter  # type: ignore[assignment]  # no None, unless just below
    head: Column = _COUNTER_HEAD
    if no_counter.any():  # the counter's texts blank where it is absent, once: only its time is the step's
        counter = ["" if s is None else s for s in texts.counter]
        head = ["" if s is None else _COUNTER_HEAD for s in texts.counter]
    layout: list[Column | int] = [*texts.lead, _TS, ',"dur":', _DUR, *texts.middle, _STEP, *texts.tail]
    slots = (len(layout), len(layout) + 2, len(layout) + 5 + len(texts.close))
    layout += [_FLOPS_KEY, _FLOPS, _BANDWIDTH_KEY, _MOVED, *texts.close, head, _END, counter]
    return _Blocks(layout, slots, samples_ns, flops.astype(np.float64), moved.astype(np.float64),
                   ~flops_known, ~moved_known, no_counter)


def _masked(values: list[str], where: np.ndarray) -> list[str]:
    """``values`` with ``""`` at the events ``where`` holds (a part an event lacks)."""
    if not where.any():  # (the usual column: every event has this part)
        return values
    if where.all():
        return [""] * len(values)
    kept = list(values)
    for i in np.flatnonzero(where).tolist():
        kept[i] = ""
    return kept


def _block_text(b: _Blocks, lo: int, hi: int, k: int, step_index: int, t_us: float) -> tuple[str, float]:
    """The events of step ``k`` of nodes ``[lo, hi)`` laid end to end from ``t_us`` (a node's counter sits
    at the next node's start), and the end time: one join of the layout's columns and the step's numbers."""
    n = hi - lo
    time_s = b.samples_ns[k, lo:hi] / NS_PER_S  # as Python's int / int rounds, below _EXACT_NS
    durations = time_s * _US
    ends = np.cumsum(np.concatenate(([t_us], durations)))  # one addition after another, as ``+=`` did
    timed = time_s > 0
    divisor = np.where(timed, time_s, 1.0)
    # The block's numbers formatted at once (one dump and one split, not four): the n + 1 stamps (each
    # node's start, the last one's end), then the durations, FLOP/s and bytes/s.
    texts = float_texts(np.concatenate((ends, durations, b.flops[lo:hi] / divisor, b.moved[lo:hi] / divisor)))
    numbers = (texts[:n], texts[n + 1:2 * n + 1], [str(step_index)] * n, texts[2 * n + 1:3 * n + 1],
               texts[3 * n + 1:], texts[1:n + 1])
    flops_at, moved_at, counter_at = b.slots
    blanks = {}  # the events lacking each optional part, by the parts' places in the layout
    for first, count, where in ((flops_at, 2, b.no_flops[lo:hi] | ~timed),  # rates only at a time above zero
                                (moved_at, 2, b.no_moved[lo:hi] | ~timed), (counter_at, 1, b.no_counter[lo:hi])):
        blanks.update(dict.fromkeys(range(first, first + count), where))
    width = len(b.layout)
    pieces = [""] * (n * width)
    for j, column in enumerate(b.layout):
        values = (numbers[column] if type(column) is int else [column] * n if type(column) is str
                  else column[lo:hi])  # type: ignore[index]
        pieces[j::width] = values if j not in blanks else _masked(values, blanks[j])  # type: ignore[arg-type]
    return "".join(pieces), float(ends[-1])


@dataclass(frozen=True)
class _Planned:
    """A graph as the step loop writes it: by blocks where it can, event by event where it cannot."""

    graph: GraphRecord
    pid: int
    texts: NodeTexts
    blocks: _Blocks | None
    #: Each node's lead, middle, tail and close (``NodeTexts.strings``), for the event-by-event loop.
    strings: tuple[list[str], list[str], list[str], list[str]] | None
    #: Each node's samples in seconds, for the event-by-event loop (None when blocks cover every step).
    times: list[tuple[float, ...]] | None
    ids: list[int]
    flops: list[Any]
    moved: list[Any]
    #: Every node's counter (``texts.counter`` keeps only the changes, for the blocks).
    counters: list[str | None]


def _finite(values: Iterable[float]) -> None:
    if not all(map(math.isfinite, values)):
        raise ValueError("Out of range float values are not JSON compliant")


def _loop_events(p: _Planned, k: int, step_index: int, t_us: float, allocator: dict[tuple[int, int, int], Any],
                 out: list[str], f: IO[str]) -> float:
    """Step ``k``'s events of ``p``'s nodes that have it, one at a time into ``out`` (written to ``f`` every
    ``CHUNK_EVENTS``), with the allocator's reads after their nodes; returns the end time."""
    lead_of, middle_of, tail_of, close_of = p.strings or ([], [], [], [])
    last_counter = None  # counters are written where they change, among the nodes that have this step
    for lead, middle, tail, close, counter, times, flops, moved, node_id in zip(
            lead_of, middle_of, tail_of, close_of, p.counters, p.times or (), p.flops, p.moved, p.ids):
        if k >= len(times):
            continue
        time_s = times[k]
        dur_us = time_s * _US
        rates = ""
        if time_s > 0:
            if flops is not None:
                rates = f"{_FLOPS_KEY}{flops / time_s!r}"
            if moved is not None:
                rates += f"{_BANDWIDTH_KEY}{moved / time_s!r}"
        out.append(f'{lead}{t_us!r},"dur":{dur_us!r}{middle}{step_index}{tail}{rates}{close}')
        t_us += dur_us
        if counter is not None and counter != last_counter:
            out.append(f"{_COUNTER_HEAD}{t_us!r}{counter}")
            last_counter = counter
        read = allocator.get((p.graph.id, step_index, node_id)) if allocator else None
        if read is not None:
            out.append("," + json_text({"name": "device memory (bytes)", "ph": "C", "ts": t_us, "pid": p.pid,
                                    "tid": STEP_TID,
                                    "args": {"allocated": read.allocated_bytes, "reserved": read.reserved_bytes}}))
        if len(out) >= CHUNK_EVENTS:
            f.write("".join(out))
            out.clear()
    return t_us


def _counts_as_arrays(frame: NodeFrame) -> tuple[np.ndarray, ...] | None:
    """(FLOPs, known, bytes moved, known) as int64 arrays, None where a count is not an int64 (then: loop)."""
    try:
        return (*int_array(frame, "flops"), *int_array(frame, "bytes_moved"))
    except ValueError:
        return None


def changes_only(counters: list[str | None]) -> list[str | None]:
    """``counters`` with None for each that repeats the last one before it (``render.chrome_trace``)."""
    kept = list(counters)
    last = None
    for i, text in enumerate(counters):
        if text is None:
            continue
        if text == last:
            kept[i] = None
        else:
            last = text
    return kept


def _counters(graph: GraphRecord, frame: NodeFrame, lo: int, hi: int, pid: int) -> list[str | None]:
    """The live-memory counter events of the graph's nodes ``[lo, hi)`` after their ``ts``: pid, tid and
    args (``chrome_texts.series_texts``), None for a node without memory. A loaded graph's are made in
    the join that makes its args (``loaded_series_texts``), without a string per node more."""
    before, after = f',"pid":{pid},"tid":{STEP_TID},"args":', "}"
    source = node_source(graph)
    texts = loaded_series_texts(source, before, after) if isinstance(source, NodeColumns) else None
    if texts is None:
        args = series_texts(frame.column("live_by_category_bytes")[lo:hi], frame.column("live_bytes")[lo:hi])
        texts = [None if s is None else f"{before}{s}{after}" for s in args]
    return texts


def write_chrome_trace(profile: Profile, f: IO[str], stat: str = "median",
                       bounds: Bounds | None = None) -> None:
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
    f.write('{"traceEvents":[' + ",".join(map(json_text, head)))

    _finite(s.wall_time_s for s in profile.steps)
    allocator = {(g.id, r.step, r.node_id): r for g in profile.graphs for r in getattr(g, "device_memory", ())}
    ids, flops_of, moved_of = frame.column("id"), frame.column("flops"), frame.column("bytes_moved")
    counts = _counts_as_arrays(frame)
    plan = []
    n_steps = len(profile.steps)
    for graph, lo, hi in spans:
        pid = pid_of.get(graph.id, PID)
        track_of = {phase: tid for (gid, phase), tid in tracks.items() if gid == graph.id}
        counters = _counters(graph, frame, lo, hi, pid)
        static = node_texts(frame, graph, lo, hi, critical.get(graph.id, frozenset()), pid, track_of,
                            changes_only(counters), bound_texts(bounds, graph.id, ids[lo:hi]))
        samples_ns, most = _samples_ns(graph, frame, lo, hi)
        n_steps = max(n_steps, most)
        blocks = None
        if samples_ns is not None and counts is not None and not any(key[0] == graph.id for key in allocator):
            blocks = _blocks(static, samples_ns, counts, lo, hi)
        times = None
        if blocks is None or blocks.samples_ns.shape[0] < most:  # some step is written event by event
            times = [tuple([t / NS_PER_S for t in (d or h)]) for d, h in
                     zip(frame.column("device_time_ns")[lo:hi], frame.column("host_time_ns")[lo:hi])]
            _finite(chain.from_iterable(times))
        plan.append(_Planned(graph, pid, static, blocks, None if times is None else static.strings(), times,
                             ids[lo:hi], flops_of[lo:hi], moved_of[lo:hi], counters))
    offset_us = 0.0
    chunk: list[str] = []
    for k in range(n_steps):
        step_index = profile.steps[k].index if k < len(profile.steps) else k
        cursor = {pid: offset_us for pid in pids}
        for p in plan:
            t_us = cursor[p.pid]
            if p.blocks is not None and k < p.blocks.samples_ns.shape[0]:  # every node has this step: by blocks
                f.write("".join(chunk))
                chunk.clear()
                n = len(p.ids)
                for lo in range(0, n, CHUNK_EVENTS):
                    text, t_us = _block_text(p.blocks, lo, min(lo + CHUNK_EVENTS, n), k, step_index, t_us)
                    f.write(text)
            elif p.times is not None:  # (None: blocks hold every step a node has; none has this one)
                t_us = _loop_events(p, k, step_index, t_us, allocator, chunk, f)
            cursor[p.pid] = t_us
        wall_us = profile.steps[k].wall_time_s * _US if k < len(profile.steps) else 0.0
        longest_us = 0.0
        for pid in pids:
            own = rank_walls.get(pid, [])
            pid_wall_us = own[k] * _US if k < len(own) else wall_us
            span_us = max(pid_wall_us, cursor[pid] - offset_us)
            longest_us = max(longest_us, span_us)
            chunk.append("," + json_text({"name": f"step {step_index}", "cat": "step", "ph": "X", "ts": offset_us,
                                      "dur": span_us, "pid": pid, "tid": STEP_TID,
                                      "args": {"step": step_index, "wall_time_s": pid_wall_us / _US,
                                               "graph_time_s": (cursor[pid] - offset_us) / _US}}))
        offset_us += longest_us
    f.write("".join(chunk))
    meta = profile.meta
    other = {"generator": "graphprof", "function": meta.function, "device": meta.device_type,
             "device_name": meta.device_name, "torch": meta.torch_version, "stat_for_critical_path": stat}
    f.write('],"displayTimeUnit":"ms","otherData":' + json_text(other) + "}")
