"""The compact, column-per-field JSON form of one graph's nodes.

Why columns: a profile of 100,000 nodes must stay near 150 bytes per node and
load in a fraction of a second. Writing each node as an object repeats every
key and every module path, source line and shape in full; here each field is
one list over the nodes, strings are indices into a per-graph string table,
whole shape and dtype tuples are indices into per-graph tables (a model
repeats a few shapes many times), input edges are id differences, and time
samples are integer ticks, one list per profiled step: nanoseconds, exactly
the ``NodeRecord`` samples (files written before them hold 0.1 ns ticks,
which are read back to the nearest nanosecond).

Layout of a graph (every column may be absent; then all nodes hold the default)::

    {"id": 0, "name": "step", "kind": "step", "size": N,
     "strings": [...], "shape_sets": [[[2, 3], null], ...], "dtype_sets": [["float32"], ...],
     "columns": {"id": [...] (absent when ids are 0..N-1), "name": [...],
                 "op"|"type"|"module"|"module_type"|"source"|"phase"|"scope": [string index],
                 "inputs": [[id - input id, ...]], "in_shapes"|"out_shapes": [shape set index],
                 "in_dtypes"|"out_dtypes": [dtype set index], "is_view": [0|1], "is_inplace": [0|1|null],
                 "flops"|"bytes_read"|"bytes_written": [int|null],
                 "memory": {"allocated_bytes": [int|null (null: no record)], ..., mapping fields:
                            {"keys": [...], "values": [[int per key]|null]}},
                 "host_time_s"|"device_time_s": {"ticks_per_s": 1000000000,
                                                 "by_step": [[tick per node], ...]} or "by_node": [[ticks], ...]}}

NodeRecord fields this module does not know (added later) are written as
plain JSON lists, so adding a field never breaks saving or loading.
"""

from __future__ import annotations

import itertools
from dataclasses import MISSING, fields
from typing import Any, Callable

import numpy as np

from graphprof.profile import schema
from graphprof.profile.node_columns import (
    Column, Edges, Flags, Indexed, Kept, MemoryColumns, NodeColumns, Positions, Samples, SparseMaps, used_entries,
)
from graphprof.profile.records import (
    NS_PER_S, GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase,
)

STRING_FIELDS = ("op", "type", "module", "module_type", "source", "phase", "scope")
SHAPE_FIELDS = ("in_shapes", "out_shapes")
DTYPE_FIELDS = ("in_dtypes", "out_dtypes")
INT_FIELDS = ("flops", "bytes_read", "bytes_written")
#: NodeRecord sample field -> its column (named for the quantity; the unit is the column's ``ticks_per_s``).
TIME_FIELDS = {"host_time_ns": "host_time_s", "device_time_ns": "device_time_s"}
_KNOWN = {"id", "name", "inputs", "is_view", "is_inplace", "memory", "attrs", *STRING_FIELDS, *SHAPE_FIELDS, *DTYPE_FIELDS,
          *INT_FIELDS, *TIME_FIELDS}
NODE_FIELDS = tuple(f.name for f in fields(NodeRecord))
NODE_DEFAULTS: dict[str, Any] = {
    f.name: (f.default if f.default is not MISSING else None) for f in fields(NodeRecord)
}  # NodeRecord has no default_factory fields; a mutable default would be shared here


ColumnError = schema.SchemaError  # a malformed column; the message names what is wrong, the caller adds where


# -- writing --------------------------------------------------------------------
class _Interner:
    """Assigns each distinct value an index in first-seen order."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def __call__(self, value: Any) -> int:
        i = self.index.get(value)
        if i is None:
            i = self.index[value] = len(self.index)
        return i

    def table(self, convert: Callable[[Any], Any] = lambda v: v) -> list[Any]:
        return [convert(v) for v in self.index]


def _shape_set_json(shapes: tuple[tuple[int, ...] | None, ...]) -> list[Any]:
    return [list(s) if s is not None else None for s in shapes]


def _to_json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json_value(v) for k, v in value.items()}
    if isinstance(value, (Phase, GraphKind)):
        return value.value
    return value


def _times_to_json(samples: list[tuple[int, ...]]) -> dict[str, Any]:
    if len({len(s) for s in samples}) == 1:
        return {"ticks_per_s": NS_PER_S, "by_step": [list(col) for col in zip(*samples)]}
    return {"ticks_per_s": NS_PER_S, "by_node": [list(s) for s in samples]}


def _memory_to_json(records: list[MemoryRecord | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(MemoryRecord):
        values = [getattr(r, f.name) if r is not None else None for r in records]
        if any(isinstance(v, dict) or hasattr(v, "keys") for v in values if v is not None):
            keys = sorted({str(k) for v in values if v is not None for k in v})
            out[f.name] = {"keys": keys, "values": [
                [int(v.get(k, 0)) for k in keys] if v is not None else None for v in values]}
        else:
            out[f.name] = [_to_json_value(v) for v in values]
    if not any(isinstance(v, list) for v in out.values()):  # a MemoryRecord with only mapping fields
        out["present"] = [int(r is not None) for r in records]
    return out


def graph_to_json(graph: GraphRecord) -> dict[str, Any]:
    """The compact JSON object of one graph (see the module docstring)."""
    nodes = graph.nodes
    strings, shapes, dtypes = _Interner(), _Interner(), _Interner()
    strings("")
    cols: dict[str, Any] = {}
    ids = [n.id for n in nodes]
    if ids != list(range(len(nodes))):
        cols["id"] = ids
    cols["name"] = [n.name for n in nodes]
    for name in STRING_FIELDS:
        values = [getattr(n, name) for n in nodes]
        if any(v != NODE_DEFAULTS[name] for v in values):
            cols[name] = [strings(v.value if name == "phase" else v) for v in values]
    if any(n.inputs for n in nodes):
        cols["inputs"] = [[n.id - i for i in n.inputs] for n in nodes]
    for name in SHAPE_FIELDS:
        if any(getattr(n, name) for n in nodes):
            cols[name] = [shapes(getattr(n, name)) for n in nodes]
    for name in DTYPE_FIELDS:
        if any(getattr(n, name) for n in nodes):
            cols[name] = [dtypes(getattr(n, name)) for n in nodes]
    if any(n.is_view for n in nodes):
        cols["is_view"] = [int(n.is_view) for n in nodes]
    if any(n.is_inplace is not None for n in nodes):
        cols["is_inplace"] = [None if n.is_inplace is None else int(n.is_inplace) for n in nodes]
    if any(n.attrs for n in nodes):
        cols["attrs"] = [[list(p) for p in n.attrs] for n in nodes]
    for name in INT_FIELDS:
        values = [getattr(n, name) for n in nodes]
        if any(v is not None for v in values):
            cols[name] = values
    if any(n.memory is not None for n in nodes):
        cols["memory"] = _memory_to_json([n.memory for n in nodes])
    for name, column in TIME_FIELDS.items():
        samples = [getattr(n, name) for n in nodes]
        if any(samples):
            cols[column] = _times_to_json(samples)
    for name in NODE_FIELDS:
        if name not in _KNOWN:
            values = [getattr(n, name) for n in nodes]
            if any(v != NODE_DEFAULTS[name] for v in values):
                cols[name] = [_to_json_value(v) for v in values]
    return {
        "id": graph.id, "name": graph.name, "kind": graph.kind.value, "size": len(nodes),
        "strings": strings.table(), "shape_sets": shapes.table(_shape_set_json),
        "dtype_sets": dtypes.table(list), "columns": cols,
    }


# -- reading --------------------------------------------------------------------
def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ColumnError(what)


def _list_of(value: Any, n: int, types: tuple[type, ...], what: str) -> list[Any]:
    _check(isinstance(value, list) and len(value) == n, f"{what} must be a list of {n} values")
    _check(set(map(type, value)) <= set(types), f"{what} holds a value of the wrong type")
    return value


def _indices(value: Any, n: int, table: list[Any], what: str) -> np.ndarray:
    """A validated column of indices into ``table``, as an intp array (resolved on demand)."""
    _check(isinstance(value, list) and len(value) == n, f"{what} must be a list of {n} values")
    failure = f"{what} refers past its table"
    packed = schema.int64_array(value)
    if packed is None:
        _list_of(value, n, (int,), what)
        packed = schema.in_range(value, 0, len(table) - 1, failure)
    return schema.within(packed, 0, len(table) - 1, failure).astype(np.intp, copy=False)


def _table_of_tuples(raw: Any, what: str, item_ok: Callable[[Any], bool]) -> list[tuple[Any, ...]]:
    _check(isinstance(raw, list), f"{what} must be a list")
    out = []
    for entry in raw:
        _check(isinstance(entry, list) and all(map(item_ok, entry)), f"{what} holds a malformed entry")
        out.append(tuple(tuple(x) if isinstance(x, list) else x for x in entry))
    return out


def _shape_ok(shape: Any) -> bool:
    return shape is None or (isinstance(shape, list) and all(
        type(d) is int and 0 <= d <= schema.INT64_MAX for d in shape))


def _to_ns(ticks: list[int], tps: int) -> list[int]:
    """Ticks of ``1 / tps`` s as nanoseconds: as they are when ``tps`` is NS_PER_S, else to the nearest ns."""
    if tps == NS_PER_S:
        return ticks
    return [(2 * t * NS_PER_S + tps) // (2 * tps) for t in ticks]  # exact integer rounding, half up


def _times_from_json(raw: Any, n: int, what: str) -> np.ndarray | list[tuple[int, ...]]:
    """The samples in ns: an int64 array of steps x nodes (``by_step``), or one tuple per node (``by_node``)."""
    _check(isinstance(raw, dict), f"{what} must be an object")
    tps = raw.get("ticks_per_s")
    _check(type(tps) is int and 0 < tps <= schema.MAX_TICKS_PER_S, f"{what}.ticks_per_s must be a positive integer")
    if "by_step" in raw:
        table = schema.tick_table(raw["by_step"], tps, f"{what}.by_step", n)
        if tps == NS_PER_S:
            return table
        # every tick is an int within +-1e9 s (checked above), so int64 holds it in ns
        cols = raw["by_step"]
        return np.array([_to_ns(col, tps) for col in cols], dtype=np.int64).reshape(len(cols), n)
    rows = _list_of(raw.get("by_node"), n, (list,), f"{what}.by_node")
    schema.ticks(rows, tps, f"{what}.by_node")  # ragged: one list per node, of any length
    return [tuple(_to_ns(row, tps)) for row in rows]


def _memory_from_json(raw: Any, n: int, what: str) -> MemoryColumns:
    _check(isinstance(raw, dict), f"{what} must be an object")
    per_field: dict[str, Column] = {}
    present: list[bool] | None = None
    present_from: str | None = None
    if "present" in raw:
        present = [bool(v) for v in schema.ints(raw["present"], schema.FLAG, f"{what}.present", n)]
    for f in fields(MemoryRecord):
        if f.name not in raw:
            continue
        col = raw[f.name]
        if isinstance(col, dict):
            keys: Any = col.get("keys")
            _check(isinstance(keys, list) and set(map(type, keys)) <= {str}, f"{what}.{f.name}.keys must be strings")
            values = _list_of(col.get("values"), n, (list, type(None)), f"{what}.{f.name}.values")
            rows = [v for v in values if v is not None]
            flat = list(itertools.chain.from_iterable(rows))
            packed = schema.int64_array(flat)
            _check(set(map(len, rows)) <= {len(keys)} and (packed is not None or set(map(type, flat)) <= {int}),
                   f"{what}.{f.name}.values holds a malformed entry")
            if packed is None:  # ints, one beyond 64 bits: schema.ints's range sentence (BYTES is all of int64)
                schema.in_range(flat, schema.BYTES.lo, schema.BYTES.hi,
                                f"{what}.{f.name}.values must hold {schema.BYTES.what}")
            per_field[f.name] = SparseMaps(keys, values)
        else:
            kept = per_field[f.name] = Kept(*schema.checked_ints(col, schema.BYTES, f"{what}.{f.name}", n, nullable=True))
            if present is None:
                present = [True] * n if kept.ints is not None else [v is not None for v in col]  # ints: no null
                present_from = f.name
    _check(present is not None, f"{what} has no field to tell which nodes have a record")
    assert present is not None
    defaults = {f.name: _field_default(f) for f in fields(MemoryRecord)}
    return MemoryColumns(per_field, present, present_from, defaults)


def _field_default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _raw_from_json(value: Any, default: Any) -> Any:
    if isinstance(value, list) and isinstance(default, tuple):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def _inputs_from_json(raw: Any, n: int, ids: Any, explicit_ids: bool) -> Edges:
    """Validate the input edges (id differences) of every node; returns how to make the ``inputs`` column.

    The edges are kept as two int64 arrays (every input id, and where each
    node's inputs start), checked with whole-array operations, and turned into
    one tuple per node only when the column is read.
    """
    rows = _list_of(raw, n, (list,), "columns.inputs")
    deltas = list(itertools.chain.from_iterable(rows))
    packed = schema.int64_array(deltas)
    _check(packed is not None or set(map(type, deltas)) <= {int}, "columns.inputs holds a non-integer")
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    id_array = np.fromiter(ids, dtype=np.int64, count=n)
    try:
        delta_array = packed if packed is not None else np.array(deltas, dtype=np.int64)
    except OverflowError:  # a difference no int64 holds cannot lead to an id of the graph
        raise ColumnError("columns.inputs refers to a node the graph does not have") from None
    owner_ids = np.repeat(id_array, counts)
    # id - difference leaves int64 (and wraps) only when the two have opposite signs and the
    # result the sign of neither: such an input id is no id of the graph.
    input_ids = owner_ids - delta_array
    wrapped = ((owner_ids >= 0) != (delta_array >= 0)) & ((input_ids >= 0) != (owner_ids >= 0))
    _check(not wrapped.any(), "columns.inputs refers to a node the graph does not have")
    if explicit_ids:
        ok = bool(np.isin(input_ids, id_array).all())
    else:
        ok = not input_ids.size or (int(input_ids.min()) >= 0 and int(input_ids.max()) < n)
    _check(ok, "columns.inputs refers to a node the graph does not have")
    return Edges(input_ids, offsets)


def graph_from_json(raw: dict[str, Any], index: int) -> GraphRecord:
    """Validate one compact graph object; ColumnError says what is wrong.

    The graph's nodes are its validated columns (``NodeColumns``): NodeRecords
    are built only when ``graph.nodes`` is read.
    """
    n: Any = raw.get("size")
    _check(type(n) is int and n >= 0, "size must be a non-negative integer")
    strings = raw.get("strings", [""])
    _check(isinstance(strings, list) and set(map(type, strings)) <= {str}, "strings must be a list of strings")
    shape_sets = _table_of_tuples(raw.get("shape_sets", []), "shape_sets", _shape_ok)
    dtype_sets = _table_of_tuples(raw.get("dtype_sets", []), "dtype_sets", lambda d: d is None or isinstance(d, str))
    cols = raw.get("columns", {})
    _check(isinstance(cols, dict), "columns must be an object")
    _check("name" in cols, "columns has no 'name'")
    makers: dict[str, Column] = {}
    ids: Any = schema.ints(cols["id"], schema.ID, "columns.id", n) if "id" in cols else range(n)
    _check("id" not in cols or len(set(ids)) == n, "columns.id holds the same id twice")
    makers["id"] = Kept(ids) if "id" in cols else Positions(n)
    makers["name"] = Kept(_list_of(cols["name"], n, (str,), "columns.name"))
    for name in STRING_FIELDS:
        if name in cols:
            index_col = _indices(cols[name], n, strings, f"columns.{name}")
            if name == "phase":
                used = set(used_entries(strings, index_col).tolist())
                try:
                    phases = [Phase(s) if i in used else None for i, s in enumerate(strings)]
                except ValueError as exc:
                    raise ColumnError(f"columns.phase holds an unknown phase ({exc})") from None
                makers["phase"] = Indexed(phases, index_col)
                makers["phase_value"] = Indexed(strings, index_col)
            else:
                makers[name] = Indexed(strings, index_col)
    _check(n == 0 or ("op" in makers and "type" in makers), "columns must have 'op' and 'type'")
    if "inputs" in cols:
        makers["inputs"] = _inputs_from_json(cols["inputs"], n, ids, "id" in cols)
    for name in SHAPE_FIELDS:
        if name in cols:
            makers[name] = Indexed(shape_sets, _indices(cols[name], n, shape_sets, f"columns.{name}"))
    for name in DTYPE_FIELDS:
        if name in cols:
            makers[name] = Indexed(dtype_sets, _indices(cols[name], n, dtype_sets, f"columns.{name}"))
    if "is_view" in cols:
        flags = _list_of(cols["is_view"], n, (int, bool), "columns.is_view")
        makers["is_view"] = Flags(flags)
    if "is_inplace" in cols:
        inplace = _list_of(cols["is_inplace"], n, (int, bool, type(None)), "columns.is_inplace")
        makers["is_inplace"] = Flags(inplace)
    if "attrs" in cols:
        makers["attrs"] = Kept(schema.pairs(cols["attrs"], "columns.attrs", n))
    for name in INT_FIELDS:
        if name in cols:
            makers[name] = Kept(*schema.checked_ints(cols[name], schema.COUNT, f"columns.{name}", n, nullable=True))
    memory = _memory_from_json(cols["memory"], n, "columns.memory") if "memory" in cols else None
    for name, column in TIME_FIELDS.items():
        if column in cols:
            makers[name] = Samples(_times_from_json(cols[column], n, f"columns.{column}"), n)
    for name in NODE_FIELDS:
        if name not in _KNOWN and name in cols:
            col = _list_of(cols[name], n, (int, float, str, bool, list, dict, type(None)), f"columns.{name}")
            makers[name] = Kept([_raw_from_json(v, NODE_DEFAULTS[name]) for v in col])
    try:
        kind = GraphKind(raw.get("kind", "step"))
    except ValueError:
        raise ColumnError(f"kind {raw.get('kind')!r} is unknown") from None
    gid = raw.get("id", index)
    schema.one_int(gid, schema.ID, "id")
    return GraphRecord(id=gid, name=schema.string(raw.get("name", ""), "name"), kind=kind,
                       nodes=NodeColumns(n, makers, memory, NODE_DEFAULTS))
