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
from operator import attrgetter
from typing import IO, Any

from graphprof.analysis.critical_path import graph_critical_path
from graphprof.analysis.dataflow import edge_arrays, is_inplace_write
from graphprof.analysis.frame import node_frame
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import GraphRecord, MemoryRecord, NodeRecord, Profile
from graphprof.render.escape import strip_control

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


class _Memo(dict):
    """``memo[value]`` is ``encode(value)``, computed once per distinct value."""

    def __init__(self, encode: Callable[[Any], str]) -> None:
        super().__init__()
        self._encode = encode

    def __missing__(self, value: Any) -> str:
        text = self[value] = self._encode(value)
        return text


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


def _types(nodes: Sequence[NodeRecord], field: str) -> set[type]:
    return set(map(type, map(attrgetter(field), nodes)))


def model_typed(profile: Profile) -> bool:
    """True when every field the writers read has the model's type (always, for a loaded profile)."""
    for graph in profile.graphs:
        nodes = graph.nodes
        if not isinstance(graph.id, int) or not isinstance(graph.name, (str, type(None))):
            return False
        if not nodes:
            continue
        if _types(nodes, "id") != {int} or _types(nodes, "is_view") != {bool}:
            return False
        if any(_types(nodes, f) != {str} for f in _TEXT_FIELDS):
            return False
        if any(not _types(nodes, f) <= {int, type(None)} for f in _COUNT_FIELDS):
            return False
        memories = [m for m in map(attrgetter("memory"), nodes) if m is not None]
        if any(type(m) is not MemoryRecord for m in memories):
            return False
        for f in ("allocated_bytes", "freed_bytes", "live_bytes"):
            if memories and not _types(memories, f) <= {int}:  # type: ignore[arg-type]
                return False
    return True


def _graph_rows(profile: Profile, stat: str) -> Iterator[tuple[GraphRecord, list[float], frozenset[int], list[list[int]]]]:
    """Per graph: its node times under ``stat``, critical-path node ids, and per position its
    edges' destinations in networkx's adjacency order (data edges, then ordering edges as ``~d``)."""
    stat_fn(stat)
    times = node_frame(profile).times(stat, "auto")
    start = 0
    for graph in profile.graphs:
        n = len(graph.nodes)
        edges = edge_arrays(graph)
        graph_times = [float(t) for t in times[start:start + n]]
        path = graph_critical_path(graph, graph_times, stat, edges)  # as critical_paths, without a second edge pass
        succ: list[list[int]] = [[] for _ in range(n)]
        for s, d in edges.data:
            succ[s].append(d)
        for s, d in edges.order:
            succ[s].append(~d)
        yield graph, graph_times, path.node_set, succ
        start += n


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
    nodes = [n for g in profile.graphs for n in g.nodes]
    present = set()
    if any(n.memory is not None for n in nodes):
        present |= {"memory_allocated_bytes", "memory_freed_bytes", "memory_live_bytes", "memory_live_by_category_bytes"}
    present |= {f for f in _COUNT_FIELDS if any(getattr(n, f) is not None for n in nodes)}
    if any(g.name is not None and g.nodes for g in profile.graphs):
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
    has_edges = any(any(succ) for _, _, _, succ in rows)
    k, key_lines = _graphml_keys(profile, attrs, has_edges)
    graph_data = "".join(_data(k["graph:" + name], _xml_text(_json_text(v) if isinstance(v, list) else str(v)))[2:]
                         for name, v in attrs.items() if v is not None)
    f.write(_GRAPHML_HEAD + key_lines + '  <graph edgedefault="directed">\n')
    text = _Memo(_xml_text)
    listed = _Memo(lambda v: _xml_text(_json_text(v)))

    def lines_of(field: str, encode: Callable[[Any], str]) -> _Memo:
        return _Memo(lambda v: _data(k[field], encode(v)) if field in k else "")

    op_l, type_l = lines_of("op", text.__getitem__), lines_of("type", text.__getitem__)
    in_s, in_d = lines_of("in_shapes", listed.__getitem__), lines_of("in_dtypes", listed.__getitem__)
    out_s, out_d = lines_of("out_shapes", listed.__getitem__), lines_of("out_dtypes", listed.__getitem__)
    mod_l, mtype_l = lines_of("module", text.__getitem__), lines_of("module_type", text.__getitem__)
    src_l, scope_l = lines_of("source", text.__getitem__), lines_of("scope", text.__getitem__)
    phase_l = lines_of("phase", lambda p: _xml_text(p.value))
    view_l, inplace_l, crit_l = (lines_of(name, str) for name in ("is_view", "inplace", "critical_path"))
    counts = [(c, k.get(c, "")) for c in _COUNT_FIELDS]
    by_category = _Memo(lambda items: _xml_text(_json_text(dict(items))))
    kname, kgid, kpos, knid, kin = k.get("name"), k.get("graph_id"), k.get("position"), k.get("node_id"), k.get("inputs")
    khost, kdev, ktime = k.get("host_time_s"), k.get("device_time_s"), k.get("time_s")
    edge_lines: list[str] = []
    for graph, times, on_path, succ in rows:
        gid = graph.id
        name_data = _data(k["graph_name"], text[graph.name]) if graph.name is not None and graph.nodes else ""
        chunk: list[str] = []
        nodes = graph.nodes
        for i, node in enumerate(nodes):
            nid = node.id
            count_data = "".join(_data(key, str(v)) for c, key in counts if (v := getattr(node, c)) is not None)
            m = node.memory
            memory_data = "" if m is None else (
                f'      <data key="{k["memory_allocated_bytes"]}">{m.allocated_bytes}</data>\n'
                f'      <data key="{k["memory_freed_bytes"]}">{m.freed_bytes}</data>\n'
                f'      <data key="{k["memory_live_bytes"]}">{m.live_bytes}</data>\n'
                + _data(k["memory_live_by_category_bytes"], by_category[tuple(m.live_by_category_bytes.items())]))
            chunk.append(
                f'    <node id="{gid}:{nid}">\n      <data key="{kgid}">{gid}</data>\n'
                f'      <data key="{kpos}">{i}</data>\n      <data key="{knid}">{nid}</data>\n'
                f'{_data(kname, text[node.name])}{op_l[node.op]}{type_l[node.type]}'
                f'      <data key="{kin}">{_numbers_text(node.inputs)}</data>\n'
                f'{in_s[node.in_shapes]}{in_d[node.in_dtypes]}{out_s[node.out_shapes]}{out_d[node.out_dtypes]}'
                f'{mod_l[node.module]}{mtype_l[node.module_type]}{src_l[node.source]}{phase_l[node.phase]}'
                f'{scope_l[node.scope]}{view_l[node.is_view]}{inplace_l[is_inplace_write(node)]}'
                f'{count_data}{memory_data}'
                f'      <data key="{khost}">{_numbers_text(node.host_time_s)}</data>\n'
                f'      <data key="{kdev}">{_numbers_text(node.device_time_s)}</data>\n'
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
                edge_lines.append(f'    <edge source="{gid}:{nodes[s].id}" target="{gid}:{nodes[d if d >= 0 else ~d].id}">\n'
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
    text = _Memo(_json_text)
    listed = _Memo(_json_text)
    by_category = _Memo(lambda items: _json_text(dict(items)))
    boolean = {True: "true", False: "false"}
    sep = "\n"
    for graph, times, on_path, _ in rows:
        gid = graph.id
        graph_name = _json_text(graph.name)
        chunk: list[str] = []
        for i, node in enumerate(graph.nodes):
            nid = node.id
            m = node.memory
            memory = "null" if m is None else (
                f'{{"allocated_bytes": {m.allocated_bytes}, "freed_bytes": {m.freed_bytes}, "live_bytes": {m.live_bytes}, '
                f'"live_by_category_bytes": {by_category[tuple(m.live_by_category_bytes.items())]}}}')
            flops, read, written = node.flops, node.bytes_read, node.bytes_written
            chunk.append(
                f'{sep}{{"graph_id": {gid}, "position": {i}, "node_id": {nid}, "name": {text[node.name]}, '
                f'"op": {text[node.op]}, "type": {text[node.type]}, "inputs": {_numbers_text(node.inputs)}, '
                f'"in_shapes": {listed[node.in_shapes]}, "in_dtypes": {listed[node.in_dtypes]}, '
                f'"out_shapes": {listed[node.out_shapes]}, "out_dtypes": {listed[node.out_dtypes]}, '
                f'"module": {text[node.module]}, "module_type": {text[node.module_type]}, "source": {text[node.source]}, '
                f'"phase": {text[node.phase.value]}, "scope": {text[node.scope]}, "is_view": {boolean[node.is_view]}, '
                f'"inplace": {boolean[is_inplace_write(node)]}, '
                f'"flops": {"null" if flops is None else flops}, "bytes_read": {"null" if read is None else read}, '
                f'"bytes_written": {"null" if written is None else written}, "memory": {memory}, '
                f'"host_time_s": {_numbers_text(node.host_time_s)}, "device_time_s": {_numbers_text(node.device_time_s)}, '
                f'"time_s": {_json_text(times[i])}, "graph_name": {graph_name}, '
                f'"critical_path": {boolean[nid in on_path]}, "id": "{gid}:{nid}"}}')
            sep = ",\n"
            if len(chunk) >= CHUNK_NODES:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))
    f.write('\n], "edges": [')
    sep = "\n"
    for graph, _, _, succ in rows:
        gid, nodes = graph.id, graph.nodes
        chunk = []
        for s, targets in enumerate(succ):
            for d in targets:
                kind = "data" if d >= 0 else "order"
                chunk.append(f'{sep}{{"kind": "{kind}", "source": "{gid}:{nodes[s].id}", '
                             f'"target": "{gid}:{nodes[d if d >= 0 else ~d].id}"}}')
                sep = ",\n"
        f.write("".join(chunk))
    f.write("\n]}\n")
