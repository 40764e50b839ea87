"""GraphML and node-link JSON written straight to a file, without building a networkx graph.

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
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from graphprof.analysis.critical_path import graph_critical_path
from graphprof.analysis.dataflow import edge_arrays, is_inplace_write
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NS_PER_S, GraphRecord, Profile
from graphprof.render.escape import strip_control
from graphprof.render.node_columns import Encoded, graph_spans

#: Nodes per write: large enough that writes are few, small enough that a chunk's text stays small.
CHUNK_NODES = 2000
_GRAPHML_HEAD = (
    "<?xml version='1.0' encoding='utf-8'?>\n"
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="http://graphml.graphdrawing.org/xmlns http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd">\n'
)
_XML_TYPE = {str: "string", int: "long", float: "double", bool: "boolean"}
_TEXT_FIELDS = ("name", "op", "type", "module", "module_type", "source", "scope")
_COUNT_FIELDS = ("flops", "bytes_read", "bytes_written")
#: Node attributes in ``analysis.dataflow``'s order, GraphML's flattened memory keys in place of ``memory``.
_GRAPHML_NODE_KEYS = (
    ("graph_id", int), ("position", int), ("node_id", int), *((f, str) for f in _TEXT_FIELDS[:3]),
    ("inputs", str), ("in_shapes", str), ("in_dtypes", str), ("out_shapes", str), ("out_dtypes", str),
    *((f, str) for f in _TEXT_FIELDS[3:6]), ("phase", str), ("scope", str), ("is_view", bool), ("inplace", bool),
    *((f, int) for f in _COUNT_FIELDS), ("memory_allocated_bytes", int), ("memory_freed_bytes", int),
    ("memory_live_bytes", int), ("memory_live_by_category_bytes", str), ("host_time_s", str),
    ("device_time_s", str), ("time_s", float), ("graph_name", str), ("critical_path", bool),
)


def _xml_text(text: str) -> str:
    """Element text as ElementTree writes it, after the XML character rule (``strip_control``)."""
    return strip_control(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _numbers_text(values: tuple) -> str:
    """JSON of a tuple of ints or finite floats (``repr`` is JSON's own number text), else ``json.dumps``'s."""
    text = ", ".join(map(repr, values))
    if "n" in text or "(" in text:  # inf, nan or something that is not a plain number: let json decide
        return _json_text(values)
    return f"[{text}]"


def _types(values: Sequence[Any]) -> set[type]:
    return set(map(type, values))


def model_typed(profile: Profile) -> bool:
    """True when every field the writers read has the model's type (always, for a loaded profile).

    Read from the node frame's columns: a node has memory when its
    ``live_by_category_bytes`` is not None, and then all three byte counts are ints.
    """
    if any(not isinstance(g.id, int) or not isinstance(g.name, (str, type(None))) for g in profile.graphs):
        return False
    frame = node_frame(profile)
    if not len(frame):
        return True
    col = frame.column
    if _types(col("id")) != {int} or _types(col("is_view")) != {bool}:
        return False
    if any(_types(col(f)) != {str} for f in _TEXT_FIELDS):
        return False
    if any(not _types(col(f)) <= {int, type(None)} for f in _COUNT_FIELDS):
        return False
    by_category = col("live_by_category_bytes")
    if not _types(by_category) <= {dict, type(None)}:
        return False
    without = by_category.count(None)
    return all(_types(col(f)) <= {int, type(None)} and col(f).count(None) == without
               for f in ("allocated_bytes", "freed_bytes", "live_bytes"))


def _graph_rows(profile: Profile, stat: str) -> Iterator[tuple[GraphRecord, int, int, list[float], frozenset[int],
                                                                list[list[int]]]]:
    """Per graph: its slice of the node frame, its node times under ``stat``, critical-path node ids, and per
    position its edges' destinations in networkx's adjacency order (data edges, then ordering edges as ``~d``)."""
    stat_fn(stat)
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    for graph, lo, hi in graph_spans(profile, frame):
        edges = edge_arrays(graph)
        graph_times = [float(t) for t in times[lo:hi]]
        path = graph_critical_path(graph, graph_times, stat, edges)  # as critical_paths, without a second edge pass
        succ: list[list[int]] = [[] for _ in range(hi - lo)]
        for s, d in edges.data:
            succ[s].append(d)
        for s, d in edges.order:
            succ[s].append(~d)
        yield graph, lo, hi, graph_times, path.node_set, succ


class _Inplace:
    """The two fields ``is_inplace_write`` reads, for one distinct (is_inplace, type) pair of columns."""

    __slots__ = ("is_inplace", "type")

    def __init__(self, key: tuple[bool | None, str]) -> None:
        self.is_inplace, self.type = key


def _inplace_flags(frame: NodeFrame, lo: int, hi: int) -> list[bool]:
    """``is_inplace_write`` of nodes ``[lo, hi)``, decided once per distinct (is_inplace, type)."""
    decided: dict[tuple[bool | None, str], bool] = {}
    pairs = list(zip(frame.column("is_inplace")[lo:hi], frame.column("type")[lo:hi]))
    for key in set(pairs):
        decided[key] = is_inplace_write(_Inplace(key))  # type: ignore[arg-type]
    return list(map(decided.__getitem__, pairs))


def _seconds_text(samples_ns: tuple[int, ...]) -> str:
    """A node's samples (ns) as the JSON list of seconds ``NodeRecord.host_time_s`` would give."""
    return _numbers_text(tuple([t / NS_PER_S for t in samples_ns])) if samples_ns else "[]"


def _graph_attrs(profile: Profile, stat: str) -> dict[str, Any]:
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
    if frame.column("live_by_category_bytes").count(None) < nodes:
        present |= {"memory_allocated_bytes", "memory_freed_bytes", "memory_live_bytes", "memory_live_by_category_bytes"}
    present |= {f for f in _COUNT_FIELDS if frame.column(f).count(None) < nodes}
    if any(g.name is not None and lo < hi for g, lo, hi in graph_spans(profile, frame)):
        present.add("graph_name")
    for name, kind in _GRAPHML_NODE_KEYS:
        optional = name.startswith("memory_") or name in _COUNT_FIELDS or name == "graph_name"
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


def write_graphml(profile: Profile, f: IO[str], stat: str = "median") -> None:
    """Write the GraphML of ``profile``'s dataflow graphs to ``f`` (``model_typed`` profiles only:
    ``graphml.write_graphml_file`` sends the others through networkx)."""
    attrs = _graph_attrs(profile, stat)
    rows = list(_graph_rows(profile, stat))
    has_edges = any(any(succ) for *_, succ in rows)
    k, key_lines = _graphml_keys(profile, attrs, has_edges)
    graph_data = "".join(_data(k["graph:" + name], _xml_text(_json_text(v) if isinstance(v, list) else str(v)))[2:]
                         for name, v in attrs.items() if v is not None)
    f.write(_GRAPHML_HEAD + key_lines + '  <graph edgedefault="directed">\n')
    text = Encoded(_xml_text)
    listed = Encoded(lambda v: _xml_text(_json_text(v)))

    def lines_of(field: str, encode: Callable[[Any], str]) -> Encoded:
        return Encoded(lambda v: _data(k[field], encode(v)) if field in k else "")

    frame = node_frame(profile)
    col = frame.column
    per_value = [lines_of("op", text.__getitem__), lines_of("type", text.__getitem__),
                 lines_of("in_shapes", listed.__getitem__), lines_of("in_dtypes", listed.__getitem__),
                 lines_of("out_shapes", listed.__getitem__), lines_of("out_dtypes", listed.__getitem__),
                 lines_of("module", text.__getitem__), lines_of("module_type", text.__getitem__),
                 lines_of("source", text.__getitem__), lines_of("phase", _xml_text), lines_of("scope", text.__getitem__),
                 lines_of("is_view", str)]
    fields = ("op", "type", "in_shapes", "in_dtypes", "out_shapes", "out_dtypes", "module", "module_type", "source",
              "phase", "scope", "is_view")
    inplace_l, crit_l = lines_of("inplace", str), lines_of("critical_path", str)
    by_category = Encoded(lambda items: _xml_text(_json_text(dict(items))))
    kname, kgid, kpos, knid, kin = k.get("name"), k.get("graph_id"), k.get("position"), k.get("node_id"), k.get("inputs")
    khost, kdev, ktime = k.get("host_time_s"), k.get("device_time_s"), k.get("time_s")
    count_keys = [(c, k.get(c, "")) for c in _COUNT_FIELDS]
    memory_keys = [k.get(f"memory_{m}") for m in ("allocated_bytes", "freed_bytes", "live_bytes", "live_by_category_bytes")]
    edge_lines: list[str] = []
    for graph, lo, hi, times, on_path, succ in rows:
        gid = graph.id
        ids = col("id")[lo:hi]
        name_data = _data(k["graph_name"], text[graph.name]) if graph.name is not None and hi > lo else ""
        static = zip(*(lines.column(col(field)[lo:hi]) for lines, field in zip(per_value, fields)))
        counts = ["".join(parts) for parts in zip(*(
            [_data(key, str(v)) if v is not None else "" for v in col(c)[lo:hi]] for c, key in count_keys))]
        memory = [
            "" if cats is None else (
                f'      <data key="{memory_keys[0]}">{a}</data>\n      <data key="{memory_keys[1]}">{fr}</data>\n'
                f'      <data key="{memory_keys[2]}">{lv}</data>\n'
                + _data(memory_keys[3], by_category[tuple(cats.items())]))
            for a, fr, lv, cats in zip(col("allocated_bytes")[lo:hi], col("freed_bytes")[lo:hi],
                                       col("live_bytes")[lo:hi], col("live_by_category_bytes")[lo:hi])]
        chunk: list[str] = []
        for i, (nid, name, (op, typ, ins, ind, outs, outd, mod, mtype, src, phase, scope, view), inplace, count_data,
                memory_data, inputs, host, device) in enumerate(zip(
                    ids, col("name")[lo:hi], static, map(inplace_l.__getitem__, _inplace_flags(frame, lo, hi)), counts,
                    memory, col("inputs")[lo:hi], col("host_time_ns")[lo:hi], col("device_time_ns")[lo:hi])):
            chunk.append(
                f'    <node id="{gid}:{nid}">\n      <data key="{kgid}">{gid}</data>\n'
                f'      <data key="{kpos}">{i}</data>\n      <data key="{knid}">{nid}</data>\n'
                f'{_data(kname, text[name])}{op}{typ}'
                f'      <data key="{kin}">{_numbers_text(inputs)}</data>\n'
                f'{ins}{ind}{outs}{outd}{mod}{mtype}{src}{phase}{scope}{view}{inplace}{count_data}{memory_data}'
                f'      <data key="{khost}">{_seconds_text(host)}</data>\n'
                f'      <data key="{kdev}">{_seconds_text(device)}</data>\n'
                f'      <data key="{ktime}">{times[i]!r}</data>\n'
                f'{name_data}{crit_l[nid in on_path]}    </node>\n')
            if len(chunk) >= CHUNK_NODES:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))
        ekey = k.get("kind")
        for s, targets in enumerate(succ):
            for d in targets:
                kind = "data" if d >= 0 else "order"
                edge_lines.append(f'    <edge source="{gid}:{ids[s]}" target="{gid}:{ids[d if d >= 0 else ~d]}">\n'
                                  f'      <data key="{ekey}">{kind}</data>\n    </edge>\n')
    for start in range(0, len(edge_lines), CHUNK_NODES):  # networkx writes every edge after every node
        f.write("".join(edge_lines[start:start + CHUNK_NODES]))
    f.write(graph_data + "  </graph>\n</graphml>\n")  # networkx writes the graph's own data last


# -- node-link JSON ------------------------------------------------------------------------
def write_node_link(profile: Profile, f: IO[str], stat: str = "median") -> None:
    """Write networkx node-link JSON of ``profile`` to ``f`` (``nx.node_link_graph(data, edges="edges")`` reads it)."""
    attrs = _graph_attrs(profile, stat)
    rows = list(_graph_rows(profile, stat))
    f.write('{"directed": true, "multigraph": false, "graph": ' + _json_text(attrs) + ', "nodes": [')
    text = Encoded(_json_text)
    by_category = Encoded(lambda items: _json_text(dict(items)))
    boolean = {True: "true", False: "false"}
    null = lambda v: "null" if v is None else v  # noqa: E731
    frame = node_frame(profile)
    col = frame.column
    fields = ("op", "type", "in_shapes", "in_dtypes", "out_shapes", "out_dtypes", "module", "module_type", "source",
              "phase", "scope")
    sep = "\n"
    for graph, lo, hi, times, on_path, _ in rows:
        gid = graph.id
        graph_name = _json_text(graph.name)
        static = zip(*(text.column(col(field)[lo:hi]) for field in fields))
        memory = [
            "null" if cats is None else (
                f'{{"allocated_bytes": {a}, "freed_bytes": {fr}, "live_bytes": {lv}, '
                f'"live_by_category_bytes": {by_category[tuple(cats.items())]}}}')
            for a, fr, lv, cats in zip(col("allocated_bytes")[lo:hi], col("freed_bytes")[lo:hi],
                                       col("live_bytes")[lo:hi], col("live_by_category_bytes")[lo:hi])]
        chunk: list[str] = []
        for i, (nid, name, (op, typ, ins, ind, outs, outd, mod, mtype, src, phase, scope), view, inplace, flops,
                read, written, memory_text, inputs, host, device) in enumerate(zip(
                    col("id")[lo:hi], col("name")[lo:hi], static, col("is_view")[lo:hi], _inplace_flags(frame, lo, hi),
                    map(null, col("flops")[lo:hi]), map(null, col("bytes_read")[lo:hi]),
                    map(null, col("bytes_written")[lo:hi]), memory, col("inputs")[lo:hi], col("host_time_ns")[lo:hi],
                    col("device_time_ns")[lo:hi])):
            chunk.append(
                f'{sep}{{"graph_id": {gid}, "position": {i}, "node_id": {nid}, "name": {text[name]}, '
                f'"op": {op}, "type": {typ}, "inputs": {_numbers_text(inputs)}, '
                f'"in_shapes": {ins}, "in_dtypes": {ind}, "out_shapes": {outs}, "out_dtypes": {outd}, '
                f'"module": {mod}, "module_type": {mtype}, "source": {src}, '
                f'"phase": {phase}, "scope": {scope}, "is_view": {boolean[view]}, "inplace": {boolean[inplace]}, '
                f'"flops": {flops}, "bytes_read": {read}, "bytes_written": {written}, "memory": {memory_text}, '
                f'"host_time_s": {_seconds_text(host)}, "device_time_s": {_seconds_text(device)}, '
                f'"time_s": {_json_text(times[i])}, "graph_name": {graph_name}, '
                f'"critical_path": {boolean[nid in on_path]}, "id": "{gid}:{nid}"}}')
            sep = ",\n"
            if len(chunk) >= CHUNK_NODES:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))
    f.write('\n], "edges": [')
    sep = "\n"
    ids = col("id")
    for graph, lo, _, _, _, succ in rows:
        gid = graph.id
        chunk = []
        for s, targets in enumerate(succ):
            for d in targets:
                kind = "data" if d >= 0 else "order"
                chunk.append(f'{sep}{{"kind": "{kind}", "source": "{gid}:{ids[lo + s]}", '
                             f'"target": "{gid}:{ids[lo + (d if d >= 0 else ~d)]}"}}')
                sep = ",\n"
        f.write("".join(chunk))
    f.write("\n]}\n")
