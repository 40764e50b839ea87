"""Columns the GraphML and node-link writers read, taken from a loaded graph's stored form where it has one.

Why: the node frame gives every field as one Python value per node, and
for two fields that value costs more to make than the text written from it:

* bytes by memory category: a loaded graph stores one row of counts per
  node over shared keys (``SparseMaps``), and the frame's column builds a
  dict per node from it (a tenth of a second at 100,000 nodes) although the
  nodes share a few hundred distinct mappings. Here each distinct row
  becomes its items once and the nodes share them;
* inputs: the file's edge arrays already hold every node's input ids; the
  frame's column makes a tuple per node, the writers then the tuple's text.

A graph without stored columns (a profile built in memory) reads the
frame's columns, so both kinds give the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from graphprof.analysis.frame import NodeFrame, graph_column, graph_indexed, graph_input_arrays
from graphprof.profile.model import GraphRecord, node_source
from graphprof.profile.node_columns import NodeColumns, SparseMaps, used_entries
from graphprof.render.column_text import Coded

#: A node's bytes by category as its items, or None for a node without a memory record.
CategoryItems = Optional[tuple[tuple[str, int], ...]]


def category_items(cats: list[dict[str, int] | None]) -> list[CategoryItems]:
    """Each bytes-by-category mapping as its items: hashable, so each distinct one is written once."""
    if None in cats:
        return [None if c is None else tuple(c.items()) for c in cats]
    return list(map(tuple, map(dict.items, cats)))  # type: ignore[arg-type]


def _stored_maps(graph: GraphRecord) -> tuple[list[str], list[list[int] | None], list[bool]] | None:
    """A loaded graph's category keys, rows and who has a memory record; None when it stores no rows."""
    source = node_source(graph)
    memory = source.memory if isinstance(source, NodeColumns) else None
    maps = memory.per_field.get("live_by_category_bytes") if memory is not None else None
    if memory is None or not isinstance(maps, SparseMaps):
        return None
    return maps.keys, maps.rows, memory.present


def _items_from_rows(keys: list[str], rows: list[list[int] | None], present: list[bool]) -> list[CategoryItems]:
    """``category_items`` of the mappings ``SparseMaps`` and ``MemoryColumns`` make from ``rows``: zero counts
    dropped, ``{}`` for a node with a record and no row, None for a node without a record."""
    if all(present) and None not in rows:
        row_keys: list[tuple[int, ...] | None] = list(map(tuple, rows))  # type: ignore[arg-type]
    else:
        row_keys = [None if not has else () if row is None else tuple(row) for has, row in zip(present, rows)]
    items = {row: None if row is None else tuple((k, x) for k, x in zip(keys, row) if x)
             for row in dict.fromkeys(row_keys)}
    return list(map(items.__getitem__, row_keys))


def category_column(frame: NodeFrame) -> list[CategoryItems]:
    """``category_items`` of the frame's ``live_by_category_bytes`` column (cached with the frame).

    Only for profiles whose mappings are dicts (``graph_stream.model_typed``
    checks that with ``maps_typed``)."""
    def build() -> list[CategoryItems]:
        out: list[CategoryItems] = []
        for graph in frame.graphs:
            stored = _stored_maps(graph)
            out += _items_from_rows(*stored) if stored is not None else category_items(
                graph_column(graph, "live_by_category_bytes"))
        return out
    return frame.memo("category_items", build)  # type: ignore[no-any-return]


def maps_typed(frame: NodeFrame) -> bool:
    """True when every node's bytes by category is a dict or None (a stored row always is one)."""
    return all(_stored_maps(g) is not None or set(map(type, graph_column(g, "live_by_category_bytes"))) <= {dict, type(None)}
               for g in frame.graphs)


def input_texts(graph: GraphRecord, lo: int, hi: int) -> list[str] | None:
    """The inputs of a loaded graph's nodes ``[lo, hi)`` as the text between JSON brackets, from its input
    arrays when no node has more than one input (a chain, as most of a model's nodes are); else None."""
    if not isinstance(node_source(graph), NodeColumns):  # ids from records may be of any type: let the caller decide
        return None
    ids, offsets = graph_input_arrays(graph)
    starts = offsets[lo:hi]
    counts = offsets[lo + 1:hi + 1] - starts
    if len(counts) and int(counts.max()) > 1:
        return None
    texts = np.full(hi - lo, "", dtype=object)
    has = counts == 1
    texts[has] = np.array(list(map(str, ids[starts[has]].tolist())), dtype=object)
    return texts.tolist()  # type: ignore[no-any-return]


def indexed_texts(graph: GraphRecord, field: str, lo: int, hi: int,
                  texts_of: Callable[[list[Any]], list[str]]) -> Coded | None:
    """The text of ``field`` for the graph's nodes ``[lo, hi)`` when the graph stores the field as a table
    of values and each node's index (``NodeColumns.indexed``): ``texts_of`` is given the table entries the
    nodes use, once each, and returns their texts. None when the graph does not store it so.

    Why: a text, shape or dtype column takes a few hundred distinct values at
    most; reading it through the frame makes a list of 100,000 values and
    then finds the distinct ones again.
    """
    stored = graph_indexed(graph, field)
    if stored is None:
        return None
    table, index = stored
    index = index[lo:hi]
    used = used_entries(table, index)
    remap = np.zeros(len(table), dtype=np.intp)
    remap[used] = np.arange(len(used), dtype=np.intp)
    return Coded(texts_of([table[u] for u in used.tolist()]), remap[index])


def stored_text_types(graph: GraphRecord, field: str) -> set[type] | None:
    """The types of the values a loaded graph stores for ``field`` as a table, or None when it does not."""
    stored = graph_indexed(graph, field)
    if stored is None:
        return None
    table, index = stored
    return {type(table[u]) for u in used_entries(table, index).tolist()}
