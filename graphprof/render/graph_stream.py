"""GraphML written straight to a file, without building a networkx graph; the rows and per-column
text it shares with the node-link writer (``node_link_stream``).

Why: a 100,000-node profile took 38 s as GraphML and 16 s as node-link JSON
through networkx (an ElementTree of 3 million elements, then a pure-Python
indented JSON encoder), and the whole document sat in memory before the
first byte was written. Here each node becomes one piece of text from a
template whose parts are cached per distinct value (module names, shapes
and dtypes repeat across thousands of nodes), and the text goes to the file
a few thousand nodes at a time.

The content is what ``render.graphml`` documents and ``graphml.profile_graph``
builds: the same node keys, attributes (``analysis.dataflow``'s record fields,
``time_s``, ``graph_name``, ``critical_path``), edges and edge ``kind``s; the
GraphML keys, their types and the indentation are those networkx writes, so a
reader sees the same graph. Node-link JSON has one node and one edge per line
(networkx indented every list element, shapes included, on its own line).

A profile whose fields hold values of other types than the model's (only a
hand-built one can) goes through networkx as before, so its types are kept.
"""

from __future__ import annotations

import json
from functools import partial
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from graphprof.analysis.critical_path import paths_and_edges
from graphprof.analysis.dataflow import is_inplace_write
from graphprof.analysis.frame import NodeFrame, graph_column, node_frame
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NS_PER_S, GraphRecord, Profile, node_source
from graphprof.profile.node_columns import Kept, NodeColumns, SparseMaps
from graphprof.render.column_text import Coded, NodeText, encoded, escaped, int_lists, seconds_columns
from graphprof.render.escape import xml_text
from graphprof.render.graph_columns import (
    CategoryItems,
    category_column,
    indexed_texts,
    input_texts,
    maps_typed,
    stored_text_types,
)
from graphprof.render.json_floats import float_texts
from graphprof.render.node_columns import adjacency, graph_spans

#: Nodes whose columns of text are made at once: bounds the memory a million-node graph's text takes.
BLOCK_NODES = 65536
_GRAPHML_HEAD = (
    "<?xml version='1.0' encoding='utf-8'?>\n"
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="http://graphml.graphdrawing.org/xmlns http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd">\n'
)
_XML_TYPE = {str: "string", int: "long", float: "double", bool: "boolean"}
_TEXT_FIELDS = ("name", "op", "type", "module", "module_type", "source", "scope")
COUNT_FIELDS = ("flops", "bytes_read", "bytes_written")
#: The memory record's byte counts the writers read.
_MEMORY_COUNTS = ("allocated_bytes", "freed_bytes", "live_bytes")
#: Node attributes in ``analysis.dataflow``'s order, GraphML's flattened memory keys in place of ``memory``.
_GRAPHML_NODE_KEYS = (
    ("graph_id", int), ("position", int), ("node_id", int), *((f, str) for f in _TEXT_FIELDS[:3]),
    ("inputs", str), ("in_shapes", str), ("in_dtypes", str), ("out_shapes", str), ("out_dtypes", str),
    *((f, str) for f in _TEXT_FIELDS[3:6]), ("phase", str), ("scope", str), ("is_view", bool), ("inplace", bool),
    *((f, int) for f in COUNT_FIELDS), ("memory_allocated_bytes", int), ("memory_freed_bytes", int),
    ("memory_live_bytes", int), ("memory_live_by_category_bytes", str), ("host_time_s", str),
    ("device_time_s", str), ("time_s", float), ("graph_name", str), ("critical_path", bool),
)


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _numbers_text(values: tuple) -> str:
    """JSON of a tuple of ints or finite floats (``repr`` is JSON's own number text), else ``json.dumps``'s."""
    text = ", ".join(map(repr, values))
    if "n" in text or "(" in text:  # inf, nan or something that is not a plain number: let json decide
        return json_text(values)
    return f"[{text}]"


def _types(values: Sequence[Any]) -> set[type]:
    return set(map(type, values))


def _checked_by_the_loader(graph: GraphRecord) -> bool:
    """Whether a graph's columns have the model's types by the loader's checks alone: loaded columns
    (ids, flags, text tables and counts are checked as such), whose memory, if any, stores the byte
    counts as integer columns and the categories as rows (a file may store a field otherwise)."""
    source = node_source(graph)
    if not isinstance(source, NodeColumns):
        return False
    if source.memory is None:
        return True
    stored = source.memory.per_field
    return isinstance(stored.get("live_by_category_bytes"), (SparseMaps, type(None))) and all(
        isinstance(stored.get(f), (Kept, type(None))) for f in _MEMORY_COUNTS)


def model_typed(profile: Profile) -> bool:
    """True when every field the writers read has the model's type (always, for a loaded profile).

    Trusted from the loader's checks where they settle it (``_checked_by_the_loader``); else read
    from the node frame's columns: a node has memory when its ``live_by_category_bytes`` is not None,
    and then all three byte counts are ints.
    """
    if any(not isinstance(g.id, int) or not isinstance(g.name, (str, type(None))) for g in profile.graphs):
        return False
    if all(map(_checked_by_the_loader, profile.graphs)):
        return True
    frame = node_frame(profile)
    if not len(frame):
        return True
    col = frame.column
    if _types(col("id")) != {int} or _types(col("is_view")) != {bool}:
        return False
    if any(_text_types(frame, f) != {str} for f in _TEXT_FIELDS):
        return False
    if any(not _types(col(f)) <= {int, type(None)} for f in COUNT_FIELDS):
        return False
    if not maps_typed(frame):
        return False
    without = category_column(frame).count(None)
    return all(_types(col(f)) <= {int, type(None)} and col(f).count(None) == without for f in _MEMORY_COUNTS)


def _text_types(frame: NodeFrame, field: str) -> set[type]:
    """The types of ``field``'s values, from a loaded graph's table of them where it has one."""
    out: set[type] = set()
    for graph in frame.graphs:
        stored = stored_text_types(graph, field)
        out |= stored if stored is not None else _types(graph_column(graph, field))
    return out


@dataclass(frozen=True)
class GraphRows:
    """What one graph's text needs besides the node frame's columns: its span of them, node times under
    the statistic, who is on the critical path, ids as text, and its edges (positions, in networkx's
    adjacency order: by source, each source's data edges, then its ordering edges)."""

    graph: GraphRecord
    lo: int
    hi: int
    times: list[float]
    critical: list[bool]
    id_text: list[str]
    position_text: list[str]
    edge_src: list[int]
    edge_dst: list[int]
    edge_order: list[bool]

    def edge_columns(self) -> tuple[list[str], list[str], list[str]]:
        """Source ids, destination ids and kinds (``data``/``order``) of the edges, as text."""
        ids = self.id_text
        return (list(map(ids.__getitem__, self.edge_src)), list(map(ids.__getitem__, self.edge_dst)),
                list(map(("data", "order").__getitem__, self.edge_order)))


def graph_rows(profile: Profile, stat: str) -> list[GraphRows]:
    """``GraphRows`` of each graph: one edge pass per graph serves both the critical path and the edges."""
    stat_fn(stat)
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    ids = frame.column("id")
    out = []
    for (graph, lo, hi), (path, edges) in zip(graph_spans(profile, frame), paths_and_edges(profile, stat)):
        on_path = path.node_set
        graph_ids = ids[lo:hi]
        id_text = list(map(str, graph_ids))
        positions = list(range(hi - lo))
        plain = graph_ids == positions and set(map(type, graph_ids)) <= {int}  # ids 0..n-1: the same text
        out.append(GraphRows(graph, lo, hi, list(map(float, times[lo:hi])), list(map(on_path.__contains__, graph_ids)),
                             id_text, id_text if plain else list(map(str, positions)), *adjacency(edges)))
    return out


class _Inplace:
    """The two fields ``is_inplace_write`` reads, for one distinct (is_inplace, type) pair of columns."""

    __slots__ = ("is_inplace", "type")

    def __init__(self, key: tuple[bool | None, str]) -> None:
        self.is_inplace, self.type = key


def inplace_flags(frame: NodeFrame, lo: int, hi: int) -> list[bool]:
    """``is_inplace_write`` of nodes ``[lo, hi)``, decided once per distinct (is_inplace, type)."""
    decided: dict[tuple[bool | None, str], bool] = {}
    pairs = list(zip(frame.column("is_inplace")[lo:hi], frame.column("type")[lo:hi]))
    for key in set(pairs):
        decided[key] = is_inplace_write(_Inplace(key))  # type: ignore[arg-type]
    return list(map(decided.__getitem__, pairs))


def _seconds_text(samples_ns: tuple[int, ...]) -> str:
    """A node's samples (ns) as the JSON list of seconds ``NodeRecord.host_time_s`` would give."""
    return _numbers_text(tuple([t / NS_PER_S for t in samples_ns])) if samples_ns else "[]"


def graph_attrs(profile: Profile, stat: str) -> dict[str, Any]:
    meta = profile.meta
    return {"function": meta.function, "device_type": meta.device_type, "device_name": meta.device_name,
            "torch_version": meta.torch_version, "stat": stat, "steps": len(profile.steps),
            "graph_names": [g.name for g in profile.graphs]}


# -- GraphML -----------------------------------------------------------------------------
def _graphml_keys(profile: Profile, graph_attrs: dict[str, Any], has_edges: bool) -> tuple[dict[str, str], str]:
    """Key ids of the attributes that occur (edge ``kind`` under ``"kind"``) and the ``<key>`` lines."""
    lines: list[str] = []
    ids: dict[str, str] = {}

    def add(ident: str, name: str, scope: str, kind: str) -> None:
        ids[ident] = f"d{len(lines)}"
        lines.append(f'  <key id="{ids[ident]}" for="{scope}" attr.name="{name}" attr.type="{kind}" />\n')

    for name, value in graph_attrs.items():  # graph attribute names may equal node ones: "graph:" keeps them apart
        if value is not None:
            add("graph:" + name, name, "graph", _graph_value_type(value))
    frame = node_frame(profile)
    nodes = len(frame)
    present = set()
    if category_column(frame).count(None) < nodes:
        present |= {"memory_allocated_bytes", "memory_freed_bytes", "memory_live_bytes", "memory_live_by_category_bytes"}
    present |= {f for f in COUNT_FIELDS if frame.column(f).count(None) < nodes}
    if any(g.name is not None and lo < hi for g, lo, hi in graph_spans(profile, frame)):
        present.add("graph_name")
    for name, kind in _GRAPHML_NODE_KEYS:
        optional = name.startswith("memory_") or name in COUNT_FIELDS or name == "graph_name"
        if nodes and (not optional or name in present):
            add(name, name, "node", _XML_TYPE[kind])
    if has_edges:
        add("kind", "kind", "edge", "string")
    return ids, "".join(reversed(lines))  # networkx puts each new key before the earlier ones


def _graph_value_type(value: Any) -> str:
    """The GraphML type of a graph attribute after ``graphml_attributes`` (text and lists become strings)."""
    if isinstance(value, (str, list, tuple, dict)):
        return "string"
    return _XML_TYPE[type(value)]


def _data(key: str | None, text: str) -> str:
    """One ``<data>`` line as ElementTree indents it (empty text: a self-closing element)."""
    return f'      <data key="{key}">{text}</data>\n' if text else f'      <data key="{key}" />\n'


def _lines(key: str, values: Sequence[Any], encode: Callable[[Any], str], by_identity: bool = False) -> Coded:
    """Each value's ``<data>`` line (none for None), made once per distinct value."""
    return encoded(values, lambda v: "" if v is None else _data(key, encode(v)), by_identity)


def _line_texts(key: str, values: list[Any]) -> list[str]:
    """The ``<data>`` line of each of a few distinct strings (one escaping check for all when none needs it)."""
    clean = escaped(values, xml_text)
    return [_data(key, v) for v in (clean if clean is not None else map(xml_text, values))]


def _text_lines(text: NodeText, key: str, rows: GraphRows, field: str, a: int, b: int,
                col: Callable[[str], list[Any]]) -> None:
    """Add each string's ``<data>`` line: per distinct value from a loaded graph's table; else the
    strings as they are when none needs escaping and none is empty (one check of the whole column,
    however many distinct names), else line by distinct value."""
    lines = indexed_texts(rows.graph, field, a, b, lambda entries: _line_texts(key, entries))
    if lines is not None:
        text.column(lines)
        return
    values = col(field)
    clean = escaped(values, xml_text)
    if clean is not None and all(clean):
        text.between(f'      <data key="{key}">', clean, "</data>\n")
    else:
        text.column(_lines(key, values, xml_text))


def _listed(value: Any) -> str:
    return xml_text(json_text(value))


def _listed_lines(key: str, values: list[Any]) -> list[str]:
    """The ``<data>`` line of each of a few distinct shape or dtype tuples (none for None)."""
    return ["" if v is None else _data(key, _listed(v)) for v in values]


def input_list_texts(rows: GraphRows, read: Callable[[], Sequence[Sequence[Any]]], a: int, b: int) -> list[str] | Coded:
    """Each node's inputs (``read()``, called only when the input arrays do not serve) as the text between JSON brackets."""
    texts = input_texts(rows.graph, a, b)
    if texts is not None:
        return texts
    values = read()
    fast = int_lists(values)
    return fast if fast is not None else encoded(values, lambda v: _numbers_text(v)[1:-1], by_identity=True)


def samples_text(text: NodeText, before: str, after: str, rows: GraphRows, field: str, samples: Sequence[Any],
                 a: int, b: int) -> None:
    """Add each node's samples of ``field`` as the JSON list of seconds ``_seconds_text`` makes, between
    ``before`` and ``after``: from the loaded graph's samples array when it has one, else node by node."""
    source = node_source(rows.graph)
    ticks = source.samples_ns(field) if isinstance(source, NodeColumns) else None
    columns = seconds_columns(ticks[:, a:b]) if ticks is not None else None
    if columns is None:
        text.between(before, encoded(samples, _seconds_text, by_identity=True), after)
        return
    text.text(before + "[")
    for i, column in enumerate(columns):
        text.text(", " if i else "").column(column)
    text.text("]" + after)


def _graphml_memory(text: NodeText, keys: list[str], col: Callable[[str], list[Any]], cats: list[CategoryItems]) -> None:
    """The four memory lines of each node that has a memory record (``cats``: its bytes by category's items)."""
    counts = [col("allocated_bytes"), col("freed_bytes"), col("live_bytes")]
    absent = [c is None for c in cats]
    if all([v is None for v in values] == absent for values in counts):
        for key, values in zip(keys, counts):
            text.column(_lines(key, values, str))
        text.column(encoded(cats, lambda pairs: "" if pairs is None else _data(keys[3], _listed(dict(pairs)))))
        return
    text.column([
        "" if c is None else (f'      <data key="{keys[0]}">{a}</data>\n      <data key="{keys[1]}">{fr}</data>\n'
                              f'      <data key="{keys[2]}">{lv}</data>\n' + _data(keys[3], _listed(dict(c))))
        for a, fr, lv, c in zip(*counts, cats)])


def _graphml_nodes(frame: NodeFrame, rows: GraphRows, a: int, b: int, k: dict[str, str]) -> NodeText:
    """The text of the graph's nodes at positions ``[a, b)``."""
    def col(name: str) -> list[Any]:
        return frame.column(name)[rows.lo + a:rows.lo + b]

    gid, ids = rows.graph.id, rows.id_text[a:b]
    text = NodeText().between(f'    <node id="{gid}:', ids, f'">\n      <data key="{k["graph_id"]}">{gid}</data>\n'
                              f'      <data key="{k["position"]}">')
    text.column(rows.position_text[a:b])
    text.between(f'</data>\n      <data key="{k["node_id"]}">', ids, "</data>\n")
    for field in ("name", "op", "type"):
        _text_lines(text, k[field], rows, field, a, b, col)
    text.between(f'      <data key="{k["inputs"]}">[', input_list_texts(rows, lambda: col("inputs"), a, b), "]</data>\n")
    for field in ("in_shapes", "in_dtypes", "out_shapes", "out_dtypes"):
        lines = indexed_texts(rows.graph, field, a, b, partial(_listed_lines, k[field]))
        text.column(lines if lines is not None else _lines(k[field], col(field), _listed, by_identity=True))
    for field in ("module", "module_type", "source", "phase", "scope"):
        _text_lines(text, k[field], rows, field, a, b, col)
    text.column(_lines(k["is_view"], col("is_view"), str))
    text.column(_lines(k["inplace"], inplace_flags(frame, rows.lo + a, rows.lo + b), str))
    for field in COUNT_FIELDS:
        if field in k:
            text.column(_lines(k[field], col(field), str))
    if "memory_allocated_bytes" in k:
        _graphml_memory(text, [k[f"memory_{m}"] for m in ("allocated_bytes", "freed_bytes", "live_bytes",
                                                          "live_by_category_bytes")], col,
                        category_column(frame)[rows.lo + a:rows.lo + b])
    samples_text(text, f'      <data key="{k["host_time_s"]}">', "</data>\n", rows, "host_time_ns", col("host_time_ns"), a, b)
    samples_text(text, f'      <data key="{k["device_time_s"]}">', "</data>\n", rows, "device_time_ns",
                 col("device_time_ns"), a, b)
    text.between(f'      <data key="{k["time_s"]}">', float_texts(np.asarray(rows.times[a:b], dtype=np.float64)), "</data>\n")
    if rows.graph.name is not None:
        text.text(_data(k["graph_name"], xml_text(rows.graph.name)))
    return text.column(_lines(k["critical_path"], rows.critical[a:b], str)).text("    </node>\n")


def write_graphml(profile: Profile, f: IO[str], stat: str = "median") -> None:
    """Write the GraphML of ``profile``'s dataflow graphs to ``f`` (``model_typed`` profiles only:
    ``graphml.write_graphml_file`` sends the others through networkx)."""
    attrs = graph_attrs(profile, stat)
    graphs = graph_rows(profile, stat)
    k, key_lines = _graphml_keys(profile, attrs, any(rows.edge_src for rows in graphs))
    graph_data = "".join(_data(k["graph:" + name], xml_text(json_text(v) if isinstance(v, list) else str(v)))[2:]
                         for name, v in attrs.items() if v is not None)
    f.write(_GRAPHML_HEAD + key_lines + '  <graph edgedefault="directed">\n')
    frame = node_frame(profile)
    for rows in graphs:
        for a in range(0, rows.hi - rows.lo, BLOCK_NODES):
            b = min(a + BLOCK_NODES, rows.hi - rows.lo)
            _graphml_nodes(frame, rows, a, b, k).write(f, b - a)
    for rows in graphs:  # networkx writes every edge after every node
        gid = rows.graph.id
        src, dst, kinds = rows.edge_columns()
        edges = NodeText().between(f'    <edge source="{gid}:', src, f'" target="{gid}:').column(dst)
        edges.between(f'">\n      <data key="{k.get("kind")}">', kinds, "</data>\n    </edge>\n").write(f, len(src))
    f.write(graph_data + "  </graph>\n</graphml>\n")  # networkx writes the graph's own data last
