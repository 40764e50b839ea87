"""Output size guards for exports: long names are clipped, and a huge file is refused before it is made.

Why: a profile stores each distinct name and shape once (column layout with
string tables), but exports repeat them per node, and a Chrome trace per node
per step. A 1 MB module name shared by every node of a 1 MB profile made a
5 GB trace and a 2 GB HTML report (10 GB of memory); one 200,000-dimension
shape made a trace 15 times its profile. Two rules bound that:

* every name an export shows (op, module, source, scope, dtype, attribute,
  graph and function names) is clipped in the middle to
  ``EXPORT_TEXT_LIMIT`` characters (the saved profile keeps it whole), and a
  shape of more than ``labels.SHAPE_DIMS_SHOWN`` dimensions is shown by its ends and
  its rank (``labels.shapes_text``);
* before rendering, the file's size is estimated from the nodes, their
  samples and their text; when the estimate (or, for formats not estimated,
  the rendered text) exceeds the limit, the export is refused with one
  sentence that gives the size and the flag to write it anyway. The default
  limit is ``LIMIT_RATIO`` times the input profile's size, and at least
  ``LIMIT_FLOOR_BYTES``: a real profile's trace is 5 to 40 times its profile
  (bytes per node per step in a trace against 8 per sample in a profile), a
  hostile one's thousands of times.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from operator import attrgetter
from typing import Any, Callable, Sequence

import numpy as np

from graphprof.analysis.frame import NodeFrame, graph_indexed, node_frame
from graphprof.profile.model import GraphRecord, NodeRecord, PeakTensor, Profile, ProfileMeta
from graphprof.profile.node_columns import used_entries
from graphprof.render.labels import shapes_text
from graphprof.render.node_columns import sample_counts
from graphprof.render.units import clip_middle, format_bytes

EXPORT_TEXT_LIMIT = 1000
LIMIT_RATIO = 50
LIMIT_FLOOR_BYTES = 256 * 2**20
#: What a profile file takes per node and per sample (``profile.serialize``'s column layout).
STORED_BYTES_PER_NODE = 150
STORED_BYTES_PER_SAMPLE = 8
#: Nodes looked at to estimate a file's size; larger graphs are sampled evenly.
ESTIMATE_SAMPLE_NODES = 5_000

_NODE_TEXT = ("name", "op", "type", "module", "module_type", "source", "scope")
_TUPLE_TEXT = ("in_dtypes", "out_dtypes", "attrs")
#: Estimated bytes per node (fixed, per sample, per character of its text) of the formats whose size
#: grows with something a profile stores once: a trace repeats nodes per step, GraphML and node-link
#: JSON carry every sample and whole shapes. Measured on benchmarks.analyze_scale's profiles.
_MODEL = {
    "chrome": (0, 620, 1), "chrome-gz": (0, 620, 1),
    "graphml": (1100, 25, 2), "nodelink": (1000, 25, 2),
}


# -- clipping ------------------------------------------------------------------------
def _longest(columns: Sequence[Sequence[Any]], tuple_columns: Sequence[Sequence[Any]]) -> int:
    """The longest string in ``columns`` (of strings) and ``tuple_columns`` (of tuples of strings, numbers
    or pairs), with C-level passes; equal tuples the loader shares are looked at once."""
    longest = max((max(map(len, c), default=0) for c in columns), default=0)
    for column in tuple_columns:
        distinct = dict(zip(map(id, column), column)).values()
        for t in distinct:
            for item in t:
                for s in (item if isinstance(item, tuple) else (item,)):
                    if isinstance(s, str) and len(s) > longest:  # attrs also hold numbers and flags
                        longest = len(s)
    return longest


def _stored(frame: NodeFrame, name: str) -> list[tuple[list[Any], np.ndarray]] | None:
    """Each graph's table of ``name``'s values and index per node, when every graph stores the field so."""
    tables = [graph_indexed(g, name) for g in frame.graphs]
    return None if None in tables else tables  # type: ignore[return-value]


def _distinct(frame: NodeFrame, name: str) -> Sequence[Any]:
    """The values of column ``name`` (each table entry a node uses once, where the graphs store a table).

    Why: the long-name check needs only the distinct values; making the whole
    column of a stored table (then measuring 100,000 values) cost more than the check.
    """
    tables = _stored(frame, name)
    if tables is None:
        return frame.column(name)
    return [table[u] for table, index in tables
            for u in used_entries(table, index).tolist()]


def _record_columns(nodes: Sequence[NodeRecord]) -> tuple[list[list[Any]], list[list[Any]]]:
    return ([list(map(attrgetter(f), nodes)) for f in _NODE_TEXT],
            [list(map(attrgetter(f), nodes)) for f in _TUPLE_TEXT])


def _clip_node(node: NodeRecord, limit: int) -> NodeRecord:
    changes: dict[str, Any] = {f: clip_middle(getattr(node, f), limit) for f in _NODE_TEXT if len(getattr(node, f)) > limit}
    for f in ("in_dtypes", "out_dtypes"):
        values = getattr(node, f)
        if any(d is not None and len(d) > limit for d in values):
            changes[f] = tuple(None if d is None else clip_middle(d, limit) for d in values)
    if any(len(k) > limit or (isinstance(v, str) and len(v) > limit) for k, v in node.attrs):
        changes["attrs"] = tuple((clip_middle(k, limit), clip_middle(v, limit) if isinstance(v, str) else v)
                                 for k, v in node.attrs)
    return replace(node, **changes) if changes else node


def _clip_graph(graph: GraphRecord, limit: int) -> GraphRecord:
    nodes = graph.nodes
    if _longest(*_record_columns(nodes)) > limit:
        nodes = tuple(_clip_node(n, limit) for n in nodes)
    peak = graph.memory_peak
    if peak is not None and any(len(t.name) > limit or len(t.category) > limit for t in peak.largest_tensors):
        peak = replace(peak, largest_tensors=tuple(
            PeakTensor(clip_middle(t.name, limit), t.nbytes, clip_middle(t.category, limit), t.node_id) for t in peak.largest_tensors))
    name = clip_middle(graph.name, limit)
    if nodes is graph.nodes and peak is graph.memory_peak and name is graph.name:
        return graph
    return replace(graph, name=name, nodes=nodes, memory_peak=peak)


def clip_profile_text(profile: Profile, limit: int = EXPORT_TEXT_LIMIT) -> Profile:
    """``profile`` with every name longer than ``limit`` clipped in the middle (itself when none is).

    Whether anything is too long is read from the node frame's columns (shared
    with the export that follows, and no node records where the frame has its
    columns without them); only a profile that needs clipping is walked graph by graph.
    """
    meta = profile.meta
    long_meta: dict[str, Any] = {f.name: clip_middle(getattr(meta, f.name), limit) for f in fields(ProfileMeta)
                 if isinstance(getattr(meta, f.name), str) and len(getattr(meta, f.name)) > limit}
    if not long_meta and not any(_long_graph_text(g, limit) for g in profile.graphs):
        frame = node_frame(profile)
        if _longest([_distinct(frame, f) for f in _NODE_TEXT], [_distinct(frame, f) for f in _TUPLE_TEXT]) <= limit:
            return profile
    graphs = tuple(_clip_graph(g, limit) for g in profile.graphs)
    if long_meta:
        meta = replace(meta, **long_meta)
    if meta is profile.meta and all(a is b for a, b in zip(graphs, profile.graphs)):
        return profile
    return type(profile)(meta=meta, steps=profile.steps, graphs=graphs)


def _long_graph_text(graph: GraphRecord, limit: int) -> bool:
    """True when the graph's name or a tensor name of its memory peak is longer than ``limit``."""
    peak = graph.memory_peak
    return len(graph.name) > limit or (peak is not None and any(
        len(t.name) > limit or len(t.category) > limit for t in peak.largest_tensors))


# -- sizes ---------------------------------------------------------------------------
def stored_bytes(profile: Profile) -> int:
    """About the size of ``profile``'s JSON file (names not counted: the file stores each once)."""
    frame = node_frame(profile)
    samples = sum(map(max, *sample_counts(profile, frame)))
    return len(frame) * STORED_BYTES_PER_NODE + samples * STORED_BYTES_PER_SAMPLE


def default_max_bytes(input_bytes: int) -> int:
    """The default limit on an export of a profile of ``input_bytes``."""
    return max(LIMIT_FLOOR_BYTES, LIMIT_RATIO * input_bytes)


def _measured(frame: NodeFrame, name: str, rows: range, measure: Callable[[Any], int]) -> np.ndarray:
    """``measure`` of column ``name`` at positions ``rows``, as int64: once per table entry the rows use,
    where every graph stores the field as a table, else once per row."""
    tables = _stored(frame, name)
    if tables is None:
        values = frame.column(name)[rows.start:rows.stop:rows.step]
        return np.fromiter(map(measure, values), dtype=np.int64, count=len(values))
    at = np.arange(rows.start, rows.stop, rows.step, dtype=np.intp)
    parts = []
    for (table, index), (lo, hi) in zip(tables, frame.spans()):
        picked = index[at[(at >= lo) & (at < hi)] - lo]
        used = used_entries(table, picked)
        sizes = np.zeros(len(table), dtype=np.int64)
        sizes[used] = [measure(table[u]) for u in used.tolist()]
        parts.append(sizes[picked])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _text_size(text: str) -> int:
    return min(len(text), EXPORT_TEXT_LIMIT)


def _dtypes_size(dtypes: Sequence[str | None]) -> int:
    return sum(min(len(d), EXPORT_TEXT_LIMIT) for d in dtypes if d is not None)


def _raw_shapes_size(shapes: Sequence[Sequence[int] | None]) -> int:
    return 3 * sum(len(s) for s in shapes if s is not None)  # the whole shapes, about 3 characters a dimension


def _shapes_size(shapes: Sequence[Sequence[int] | None]) -> int:
    return len(shapes_text(shapes, limit=8))


def _node_texts(frame: NodeFrame, rows: range, raw_shapes: bool) -> np.ndarray:
    """Characters of the text of nodes ``rows`` in an export (names clipped to ``EXPORT_TEXT_LIMIT``).

    Each name, dtype list and shape list is measured once per stored table
    entry (``_measured``): measuring the sampled nodes one by one was most of an export's guard.
    """
    graph_names = np.array([len(g.name) for g in frame.graphs] or [0], dtype=np.int64)
    graph_index = np.repeat(np.arange(len(frame.graphs)), frame.sizes)[rows.start:rows.stop:rows.step]
    chars = graph_names[graph_index]
    for name in _NODE_TEXT:
        chars += _measured(frame, name, rows, _text_size)
    for name in ("in_dtypes", "out_dtypes"):
        chars += _measured(frame, name, rows, _dtypes_size)
    for name in ("in_shapes", "out_shapes"):
        chars += _measured(frame, name, rows, _raw_shapes_size if raw_shapes else _shapes_size)
    return chars


def estimated_bytes(profile: Profile, format: str) -> int | None:
    """About the size of ``profile`` exported as ``format``, or None for a format not estimated.

    Graphs of more than ``ESTIMATE_SAMPLE_NODES`` nodes are sampled evenly
    (every ``stride``-th node in execution order) and the sum scaled back up.
    """
    model = _MODEL.get(format)
    if model is None:
        return None
    fixed, per_sample, per_char = model
    frame = node_frame(profile)
    stride = max(1, len(frame) // ESTIMATE_SAMPLE_NODES)
    host, device = sample_counts(profile, frame)
    per_step = format.startswith("chrome")
    rows = range(0, len(frame), stride)
    samples = np.maximum(np.array(host[::stride], dtype=np.int64), np.array(device[::stride], dtype=np.int64))
    text = per_char * _node_texts(frame, rows, raw_shapes=not per_step)
    sizes = fixed + (text + per_sample) * samples if per_step else fixed + text + per_sample * samples
    return int(sizes.sum()) * stride


def too_large(format: str, size_bytes: int, max_bytes: int, input_bytes: int, estimated: bool) -> str | None:
    """The sentence that refuses an export of ``size_bytes`` over ``max_bytes`` (0: no limit), else None."""
    if not max_bytes or size_bytes <= max_bytes:
        return None
    size = f"about {format_bytes(size_bytes)}" if estimated else format_bytes(size_bytes)
    return (f"the {format} export would be {size}, {size_bytes / max(input_bytes, 1):.0f} times the profile's "
            f"{format_bytes(input_bytes)} and over the {format_bytes(max_bytes)} limit; write it anyway with "
            f"--max-size {_size_flag(size_bytes)} (max_bytes= in Python), or --max-size 0 for no limit")


def _size_flag(size_bytes: int) -> str:
    """A ``--max-size`` value a little above ``size_bytes``, in whole MiB or GiB."""
    mib = -(-size_bytes * 5 // 4 // 2**20)
    return f"{-(-mib // 1024)}G" if mib >= 1024 else f"{mib}M"


_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """``--max-size``'s value in bytes: ``500M``, ``2G``, ``1.5GiB``, ``123456``, ``0`` (no limit)."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = s[-1:] if s[-1:] in _SIZE_UNITS and s[-1:] else ""
    try:
        value = float(s[: len(s) - len(unit)])
    except ValueError:
        value = -1.0
    if not value >= 0 or value > 2**62:
        raise ValueError(f"--max-size takes a size such as 500M or 2G (0 for no limit), not {clip_middle(text, 40)!r}")
    return math.ceil(value * _SIZE_UNITS[unit])  # up: a limit under one byte is one byte, never "no limit"
