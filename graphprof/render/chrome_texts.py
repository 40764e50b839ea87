"""The parts of a Chrome trace's node events that no step changes, as columns of text.

Why apart from ``chrome_stream``: a trace repeats each node once per step,
so everything but the step's numbers (name, track, static args, bound,
memory counter) is encoded once per node here, as the JSON text the
dict-per-event trace had (keys in the documented order), and the writer
only puts numbers between these columns (``NodeTexts``). Columns' texts are
made once per distinct value (``Encoded``, ``Coded``) where values repeat.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np
import orjson

from graphprof.analysis.frame import NodeFrame
from graphprof.profile.model import GraphRecord
from graphprof.profile.node_columns import NodeColumns, SparseMaps
from graphprof.render.column_text import SMALL_TABLE, Coded, Column, NodeText, encoded, escaped, joined
from graphprof.render.graph_columns import indexed_texts
from graphprof.render.json_floats import number_texts
from graphprof.render.labels import shapes_text
from graphprof.render.node_columns import Encoded

CRITICAL_CNAME = "terrible"
#: The end of a node event, by whether the node is on the critical path.
_END = ("}}", f'}},"cname":"{CRITICAL_CNAME}"}}')

#: JSON text as ``json.dumps(..., separators=(",", ":"))`` writes it (ASCII, no NaN).
json_text = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def _count(value: Any) -> str:
    return "null" if value is None else str(value) if type(value) is int else json_text(value)


def _counts(values: list[Any]) -> list[str]:
    """``_count`` of each value. Plain ints (the usual case) are ``str``'s text, which one ``orjson.dumps`` of
    the column writes (a third of the time of a ``str`` per value), ``str`` itself beyond 64 bits."""
    if not values or not set(map(type, values)) <= {int}:
        return list(map(_count, values))
    try:
        return number_texts(values)
    except orjson.JSONEncodeError:
        return list(map(str, values))


def _coded_counts(values: list[Any]) -> Coded | list[str]:
    """``_counts`` of a column, as a ``Coded`` column where its values are int64s of a few distinct values
    (FLOPs and bytes of layers repeated through a model): the neighbouring static args are then made
    into one column of their combinations (``column_text.combined``), fewer pieces for every step of the
    trace to place. The distinct values and each node's are found by sorting (``np.unique``), not by a
    dict, which would also take ``True`` and ``1.0`` for ``1``: only plain ints are coded."""
    if not values or not set(map(type, values)) <= {int}:
        return _counts(values)
    try:
        array = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:  # beyond 64 bits
        return _counts(values)
    distinct, codes = np.unique(array, return_inverse=True)
    if len(distinct) > SMALL_TABLE:  # mostly distinct: a column of its own, from one dump
        return _counts(values)
    return Coded(number_texts(distinct), codes.reshape(-1).astype(np.intp, copy=False))


def _series(by_category: Any, live: Any) -> str | None:
    """The live-memory counter's args from live bytes by category and live bytes, None without memory."""
    if by_category is None and live is None:
        return None
    series = {str(k): int(v) for k, v in (by_category or {}).items()} or {"live": live}
    return json_text(series)


def _series_template(keys: tuple[Any, ...]) -> str | None:
    """``_series`` of a mapping with these keys as a ``%`` template of its values (``%d`` writes ``int(v)``)."""
    if not all(type(k) is str for k in keys):
        return None
    return "{" + ",".join(encode_basestring_ascii(k).replace("%", "%%") + ":%d" for k in keys) + "}"


def _dumped_series(by_category: list[Any]) -> list[str | None] | None:
    """``_series`` of every node from one ``orjson.dumps`` of the whole column, where that writes the same
    text: every node has a non-empty plain dict of plain ints, under printable-ASCII keys (which both
    encoders escape alike); None otherwise. Why: a ``%`` template per node, and a Python loop where
    nodes differ in their categories, were a third of a trace's fixed texts."""
    if not all(by_category) or set(map(type, by_category)) != {dict}:  # no memory, or {}: node by node
        return None
    keys = set(itertools.chain.from_iterable(by_category))
    if not all(type(k) is str and k.isascii() and k.isprintable() for k in keys) or \
            set(map(type, itertools.chain.from_iterable(map(dict.values, by_category)))) != {int}:
        return None
    try:
        text = orjson.dumps(by_category).decode("ascii")
    except orjson.JSONEncodeError:  # an int beyond 64 bits
        return None
    rows: list[str | None] = text[1:-1].replace("},{", "}\x00{").split("\x00")  # type: ignore[assignment]
    return rows if len(rows) == len(by_category) else None  # a key holding "},{" splits wrongly: node by node


def series_texts(by_category: list[Any], live: list[Any]) -> list[str | None]:
    """``_series`` of every node: one dump of the column where it can (``_dumped_series``), else by
    templates: nodes share their categories, so each set of category names is one ``%`` template and a
    node's text is its values put in, without a dict per node."""
    texts = _dumped_series(by_category)
    if texts is not None:
        return texts
    keys = set(map(tuple, by_category)) if None not in by_category else set()
    if len(keys) == 1 and () not in keys:  # every node has memory, by the same categories
        template = _series_template(keys.pop())
        if template is not None:
            try:
                return list(map(template.__mod__, map(tuple, map(dict.values, by_category))))
            except TypeError:  # a value ``%d`` does not take, or a mapping that is not a dict: node by node
                pass
    templates = Encoded(_series_template)
    out: list[str | None] = []
    for mapping, live_bytes in zip(by_category, live):
        template = templates[tuple(mapping)] if mapping else None
        try:
            out.append(template % tuple(mapping.values()) if template else _series(mapping, live_bytes))
        except TypeError:
            out.append(_series(mapping, live_bytes))
    return out


#: Most categories ``loaded_series_texts`` codes as the bits of an int64 (more: node by node).
_MOST_CATEGORIES = 62


def _mapping_texts(keys: list[str], values: np.ndarray, before: str = "", after: str = "") -> list[str]:
    """``json_text`` of ``dict(zip(keys, row))`` for each row of the int64 matrix ``values``, between ``before``
    and ``after``: each column's numbers from one ``orjson.dumps`` (an int64's text is ``str``'s), laid
    between the keys' texts and joined once; NUL, which ``encode_basestring_ascii`` always escapes, parts
    the rows."""
    n, width = values.shape
    if not n:
        return []
    step = 2 * width + 1
    pieces = [""] * (n * step)
    for j, key in enumerate(keys):
        pieces[2 * j::step] = [(before + "{" if not j else ",") + encode_basestring_ascii(key) + ":"] * n
        pieces[2 * j + 1::step] = number_texts(values[:, j])
    pieces[step - 1::step] = ["}" + after + "\x00"] * n
    return "".join(pieces).split("\x00")[:-1]


def loaded_series_texts(source: NodeColumns, before: str = "", after: str = "") -> list[str | None] | None:
    """``series_texts`` of a loaded graph's nodes, each between ``before`` and ``after`` (the counter event's
    text around its args, laid in the same join), from its memory columns as the file holds them: the
    categories as one int64 matrix over the nodes with a row, grouped by which categories are non-zero
    (what the node's mapping keeps), each group's texts laid from one dump per category (``_mapping_texts``).
    None where the columns' layout needs the mappings (a category named twice, which the mapping
    resolves; more categories than ``_MOST_CATEGORIES``).

    Why: building a dict per node from the stored rows, only to write each as text, was a seventh of a
    100,000-node trace export."""
    memory = source.memory
    if memory is None:
        return [None] * source.size
    maps = memory.per_field.get("live_by_category_bytes")
    if not isinstance(maps, SparseMaps):
        return None
    present, width = memory.present, len(maps.keys)
    if width > _MOST_CATEGORIES or len(set(maps.keys)) != width:
        return None
    if all(present) and None not in maps.rows:
        at = np.arange(source.size)
        rows: list[list[int]] = maps.rows  # type: ignore[assignment]  # no None, as just checked
    else:
        at = np.array([i for i, (has, row) in enumerate(zip(present, maps.rows)) if has and row is not None],
                      dtype=np.intp)
        rows = [maps.rows[i] for i in at.tolist()]  # type: ignore[misc]  # the rows that are not None
    flat = list(itertools.chain.from_iterable(rows))
    if len(flat) != len(at) * width:
        return None
    matrix = np.fromiter(flat, dtype=np.int64, count=len(flat)).reshape(len(at), width)  # the loader checked int64
    out = np.full(source.size, None, dtype=object)
    made = np.zeros(source.size, dtype=bool)
    patterns = (matrix != 0).astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))  # bit c: category c kept
    for pattern in sorted(set(patterns.tolist())):
        if not pattern:  # every category 0: the mapping is empty, and the text is live bytes'
            continue
        columns = [c for c in range(width) if pattern >> c & 1]
        members = np.flatnonzero(patterns == pattern)
        made[at[members]] = True
        out[at[members]] = _mapping_texts([maps.keys[c] for c in columns],
                                          matrix[members][:, columns] if len(members) < len(at) else matrix[:, columns],
                                          before, after)
    texts: list[str | None] = out.tolist()
    live: list[Any] | None = None
    for i in np.flatnonzero(~made).tolist():
        if present[i]:  # a record without categories (a null row, or only zeros): ``_series`` writes live bytes
            live = memory.field_values("live_bytes") if live is None else live
            mapping = memory.defaults["live_by_category_bytes"] if maps.rows[i] is None else {}
            texts[i] = f"{before}{_series(mapping, live[i])}{after}"
    return texts


@dataclass(frozen=True)
class NodeTexts:
    """The parts of a graph's node events that no step changes, in the documented key order: each part as
    columns (``NodeText.columns``: constants and one text per node), which the writer lays between the
    step's numbers as they are.

    Why columns and not a string per node: most of a node's text is a few distinct texts (a ``Coded``
    table's entries, shared by the nodes that have them); joining them into a string per node made
    tens of MB of strings at 100,000 nodes, a quarter of a trace export, that the writer then copied
    again in every step. Laid as columns, a step's text is one join of the shared strings."""

    #: ``,{"name":…,"cat":…,"ph":"X","ts":`` (the comma before every event included).
    lead: list[Column]
    #: ``,"pid":…,"tid":…,"args":{"graph":…,"node":…,"name":…,"op":…,"step":``
    middle: list[Column]
    #: ``,"module":…`` up to ``"critical_path":…`` (the static args after ``step``).
    tail: list[Column]
    #: The bound, then the end of the event (with the critical path's colour).
    close: list[Column]
    #: The live-memory counter event after its ``ts`` (its pid, tid, args and closing brace), None without memory.
    counter: list[str | None]

    def strings(self) -> tuple[list[str], list[str], list[str], list[str]]:
        """Each node's lead, middle, tail and close as a string of its own (for the event-by-event writer)."""
        size = len(self.counter)
        return joined(self.lead, size), joined(self.middle, size), joined(self.tail, size), joined(self.close, size)


def _json_inner(text: str) -> str:
    """A string's JSON text without its quotes (``encode_basestring_ascii`` works character by character)."""
    return encode_basestring_ascii(text)[1:-1]


def node_texts(frame: NodeFrame, graph: GraphRecord, lo: int, hi: int, critical: frozenset[int], pid: int,
               track_of: dict[str, int], counter: list[str | None], bounds: list[str]) -> NodeTexts:
    """``NodeTexts`` of ``graph``'s nodes, ``[lo, hi)`` in ``frame``.

    Each text and shape column's text is made once per distinct value (from the graph's stored table
    where it has one) and a run of such columns once per combination that occurs (``column_text``);
    names and counts, each node's own, are columns of their own.
    """
    size = hi - lo
    col = lambda name: frame.column(name)[lo:hi]  # noqa: E731

    def coded(field: str, encode: Callable[[Any], str]) -> Coded:
        stored = indexed_texts(graph, field, 0, size, lambda entries: list(map(encode, entries)))
        return stored if stored is not None else encoded(col(field), encode)

    string = lambda field: coded(field, encode_basestring_ascii)  # noqa: E731
    shapes = lambda field: coded(field, lambda v: encode_basestring_ascii(shapes_text(v, limit=8)))  # noqa: E731
    dtypes = coded("in_dtypes", lambda v: encode_basestring_ascii(", ".join(d or "-" for d in v)))
    tracks = coded("phase", {p: str(t) for p, t in track_of.items()}.__getitem__)
    on_path = Coded(["false", "true"], np.fromiter(map(critical.__contains__, col("id")), dtype=np.intp, count=size))
    names = col("name")
    plain = escaped(names, _json_inner)  # usually no name needs escaping: the names as they are, in quotes
    lead = NodeText().text(',{"name":').column(string("type")).text(',"cat":').column(string("phase")).text(
        ',"ph":"X","ts":')
    middle = NodeText().text(f',"pid":{pid},"tid":').column(tracks).text(
        f',"args":{{"graph":{json_text(graph.name)},"node":').column(_counts(col("id")))
    if plain is not None:
        middle.between(',"name":"', plain, '","op":')
    else:
        middle.between(',"name":', list(map(encode_basestring_ascii, names)), ',"op":')
    middle.column(string("op")).text(',"step":')
    tail = NodeText()
    for key in ("module", "module_type", "source", "phase", "scope"):
        tail.text(f',"{key}":').column(string(key))
    tail.between(',"in_shapes":', shapes("in_shapes"), ',"out_shapes":').column(shapes("out_shapes"))
    tail.between(',"in_dtypes":', dtypes, ',"flops":').column(_coded_counts(col("flops")))
    tail.between(',"bytes_read":', _coded_counts(col("bytes_read")), ',"bytes_written":').column(
        _coded_counts(col("bytes_written")))
    tail.between(',"critical_path":', on_path, "")
    close = NodeText().column(encoded(bounds, str)).column(Coded(list(_END), on_path.codes))
    return NodeTexts(lead.columns(size), middle.columns(size), tail.columns(size), close.columns(size), counter)


def bound_texts(bounds: Mapping[Any, Any] | None, graph_id: int, ids: list[int]) -> list[str]:
    """``,"bound":…`` for each node with a roofline bound (looked up as ``labels.bound_of`` does), else ""."""
    if not bounds:
        return [""] * len(ids)
    found = list(map(bounds.get, zip([graph_id] * len(ids), ids)))
    if None in found:
        found = [bounds.get(i) if v is None else v for v, i in zip(found, ids)]
    return Encoded(lambda v: "" if v is None else ',"bound":' + json_text(str(getattr(v, "value", v)))).column(found)
