"""Node-link JSON written straight to a file, without building a networkx graph.

Why a writer of its own: networkx's node-link writer builds the whole
document, then indents every list element on its own line with a pure-Python
encoder (16 s for 100,000 nodes). Here the nodes share ``graph_stream``'s
rows, edges and per-column text (GraphML is written from the same pieces),
and each node and each edge is one line, written a block of nodes at a time.
``nx.node_link_graph(data, edges="edges")`` reads it as the graph
``render.graphml`` documents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

import numpy as np

from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.profile.model import Profile
from graphprof.render.column_text import NodeText, encoded, escaped
from graphprof.render.graph_stream import (
    BLOCK_NODES,
    COUNT_FIELDS,
    GraphRows,
    graph_attrs,
    graph_rows,
    inplace_flags,
    input_list_texts,
    json_text,
    samples_text,
)
from graphprof.render.graph_columns import CategoryItems, category_column, indexed_texts
from graphprof.render.json_floats import float_texts


def _json_inner(text: str) -> str:
    """A string's JSON text without its quotes (escaping works character by character)."""
    return json_text(text)[1:-1]


def _node_link_memory(text: NodeText, col: Callable[[str], list[Any]], cats: list[CategoryItems]) -> None:
    """Each node's ``"memory"`` member: an object, or null for a node without a memory record (``cats``:
    its bytes by category's items)."""
    counts = [col("allocated_bytes"), col("freed_bytes"), col("live_bytes")]
    absent = [c is None for c in cats]
    if all(absent):
        text.text('"memory": null')
    elif all([v is None for v in values] == absent for values in counts):
        columns = [*(encoded(values, _count_text) for values in counts), encoded(cats, _categories_json)]
        for i, (head, column) in enumerate(zip(_MEMORY_HEADS, columns)):
            if True in absent:  # a node without a record has "null" where the first head would be, then nothing
                text.column(list(map({False: head, True: "" if i else '"memory": null'}.__getitem__, absent)))
            else:
                text.text(head)
            text.column(column)
    else:
        text.text('"memory": ').column([
            "null" if c is None else (f'{{"allocated_bytes": {a}, "freed_bytes": {fr}, "live_bytes": {lv}, '
                                      f'"live_by_category_bytes": {json_text(dict(c))}}}')
            for a, fr, lv, c in zip(*counts, cats)])


_MEMORY_HEADS = ('"memory": {"allocated_bytes": ', ', "freed_bytes": ', ', "live_bytes": ',
                 ', "live_by_category_bytes": ')


def _count_text(value: Any) -> str:
    return "" if value is None else str(value)


def _categories_json(pairs: tuple[tuple[str, int], ...] | None) -> str:
    return "" if pairs is None else json_text(dict(pairs)) + "}"


def _null_or_text(value: Any) -> str:
    return "null" if value is None else str(value)


_BOOLEAN = {True: "true", False: "false"}


def _json_strings(values: list[Any]) -> list[str]:
    """The JSON text of each of a few distinct strings (one escaping check for all when none needs it)."""
    clean = escaped(values, _json_inner)
    return [f'"{v}"' for v in clean] if clean is not None else list(map(json_text, values))


def _node_link_nodes(frame: NodeFrame, rows: GraphRows, a: int, b: int) -> NodeText:
    """The node-link objects of the graph's nodes at positions ``[a, b)``, each after ``",\n"``."""
    def col(name: str) -> list[Any]:
        return frame.column(name)[rows.lo + a:rows.lo + b]

    def strings(field: str) -> None:  # the strings as they are, between quotes, when none needs escaping
        stored = indexed_texts(rows.graph, field, a, b, _json_strings)
        if stored is not None:
            text.between(f', "{field}": ', stored, "")
            return
        values = col(field)
        clean = escaped(values, _json_inner)
        if clean is None:
            text.between(f', "{field}": ', encoded(values, json_text), "")
        else:
            text.between(f', "{field}": "', clean, '"')

    gid, ids = rows.graph.id, rows.id_text[a:b]
    text = NodeText().between(f',\n{{"graph_id": {gid}, "position": ', rows.position_text[a:b], ', "node_id": ')
    text.column(ids)
    for field in ("name", "op", "type"):
        strings(field)
    text.between(', "inputs": [', input_list_texts(rows, lambda: col("inputs"), a, b), "]")
    for field in ("in_shapes", "in_dtypes", "out_shapes", "out_dtypes"):
        stored = indexed_texts(rows.graph, field, a, b, lambda entries: list(map(json_text, entries)))
        text.between(f', "{field}": ', stored if stored is not None else encoded(col(field), json_text, by_identity=True), "")
    for field in ("module", "module_type", "source", "phase", "scope"):
        strings(field)
    text.between(', "is_view": ', encoded(col("is_view"), _BOOLEAN.__getitem__), "")
    text.between(', "inplace": ', encoded(inplace_flags(frame, rows.lo + a, rows.lo + b), _BOOLEAN.__getitem__), "")
    for field in COUNT_FIELDS:
        text.between(f', "{field}": ', encoded(col(field), _null_or_text), "")
    text.text(", ")
    _node_link_memory(text, col, category_column(frame)[rows.lo + a:rows.lo + b])
    samples_text(text, ', "host_time_s": ', "", rows, "host_time_ns", col("host_time_ns"), a, b)
    samples_text(text, ', "device_time_s": ', "", rows, "device_time_ns", col("device_time_ns"), a, b)
    times = np.asarray(rows.times[a:b], dtype=np.float64)  # JSON has no NaN: json_text refuses it, as before
    text.between(', "time_s": ', float_texts(times) if np.isfinite(times).all() else encoded(rows.times[a:b], json_text), "")
    text.text(f', "graph_name": {json_text(rows.graph.name)}, "critical_path": ')
    text.column(encoded(rows.critical[a:b], _BOOLEAN.__getitem__))
    return text.between(f', "id": "{gid}:', ids, '"}')


def write_node_link(profile: Profile, f: IO[str], stat: str = "median") -> None:
    """Write networkx node-link JSON of ``profile`` to ``f`` (``nx.node_link_graph(data, edges="edges")`` reads it)."""
    attrs = graph_attrs(profile, stat)
    graphs = graph_rows(profile, stat)
    f.write('{"directed": true, "multigraph": false, "graph": ' + json_text(attrs) + ', "nodes": [')
    frame = node_frame(profile)
    skip = 1  # the first node follows "[\n", the others ",\n"
    for rows in graphs:
        for a in range(0, rows.hi - rows.lo, BLOCK_NODES):
            b = min(a + BLOCK_NODES, rows.hi - rows.lo)
            _node_link_nodes(frame, rows, a, b).write(f, b - a, skip)
            skip = 0
    f.write('\n], "edges": [')
    skip = 1
    for rows in graphs:
        gid = rows.graph.id
        src, dst, kinds = rows.edge_columns()
        edges = NodeText().between(',\n{"kind": "', kinds, f'", "source": "{gid}:').column(src)
        edges.between(f'", "target": "{gid}:', dst, '"}').write(f, len(src), skip)
        skip = skip and not src
    f.write("\n]}\n")
