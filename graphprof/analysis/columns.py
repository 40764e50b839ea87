"""The columns of a profile table: keys, aliases, kinds, and ordering by any of them.

A column key is the attribute of a table entry and row (``time_s``,
``flops``, ``live_bytes`` ...) and the field name in ``--format json/csv``.
``--order-by`` takes a key or an alias; ordering is generic over the kind of
column, so a new numeric column (say, from the memory pass) is orderable by
adding one line here.

Ordering never fails on missing values (MegEngine's profile_analyze crashed
sorting FLOPs when some ops had none, and sorting by shapes): unknown values
(``None``, shown as N/A) come last in either direction, text sorts as text,
shapes by element count then dimensions; ties keep execution order.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import get_close_matches
from operator import attrgetter
from typing import Any, Callable, Sequence

from graphprof.analysis.options import TableOptionError

NUMBER, TEXT, SHAPES = "number", "text", "shapes"


@dataclass(frozen=True)
class Column:
    """A table column. ``unit`` tells renderers how to scale it for humans."""

    key: str
    title: str
    kind: str = NUMBER
    unit: str = ""
    aliases: tuple[str, ...] = ()
    orderable: bool = True


COLUMNS: tuple[Column, ...] = (
    Column("time_s", "self time", unit="s", aliases=("time", "self_time", "self")),
    Column("percent", "%", unit="%", aliases=("pct", "ratio")),
    Column("cumulative_percent", "cum %", unit="%", orderable=False),
    Column("calls", "calls", unit="count", aliases=("count",)),
    Column("id", "id", unit="id", aliases=("opr_id", "node_id")),
    Column("flops", "FLOPs", unit="FLOP", aliases=("computation", "flop")),
    Column("flop_per_s", "FLOP/s", unit="FLOP/s", aliases=("flop_rate", "flop/s", "flops_per_s")),
    Column("bytes_moved", "bytes", unit="B", aliases=("bytes",)),
    Column("bytes_read", "read", unit="B", aliases=("read",)),
    Column("bytes_written", "written", unit="B", aliases=("written",)),
    Column("bandwidth_bytes_per_s", "B/s", unit="B/s", aliases=("bandwidth", "bw")),
    Column("intensity_flop_per_byte", "FLOP/B", unit="FLOP/B", aliases=("intensity", "arithmetic_intensity")),
    Column("allocated_bytes", "alloc", unit="B", aliases=("allocated", "alloc")),
    Column("freed_bytes", "freed", unit="B", aliases=("freed",)),
    Column("live_bytes", "live", unit="B", aliases=("live",)),
    Column("name", "node", TEXT),
    Column("type", "type", TEXT),
    Column("op", "op", TEXT),
    Column("module", "module", TEXT),
    Column("module_type", "module type", TEXT),
    Column("source", "source", TEXT),
    Column("phase", "phase", TEXT),
    Column("scope", "scope", TEXT),
    Column("graph", "graph", TEXT),
    Column("in_shapes", "in shapes", SHAPES, aliases=("shape", "shapes", "input_shapes")),
    Column("out_shapes", "out shapes", SHAPES, aliases=("output_shapes",)),
)
BY_KEY: dict[str, Column] = {c.key: c for c in COLUMNS}
MEMORY_KEYS = ("allocated_bytes", "freed_bytes", "live_bytes")
_LOOKUP: dict[str, Column] = {**{a: c for c in COLUMNS for a in c.aliases}, **BY_KEY}
#: Names other tools use that mean something else here; the error says what to use.
_HINTS = {
    "memory": "MegEngine's 'memory' (bytes of inputs and outputs) is 'bytes_moved' here; "
              "modelled memory is 'allocated_bytes', 'freed_bytes' and 'live_bytes'",
    "cpu_time_total": "torch.profiler's 'cpu_time_total' is 'time' here",
    "self_cpu_time_total": "torch.profiler's 'self_cpu_time_total' is 'time' here",
    "cumulative_percent": "the cumulative share depends on the order, so it cannot be the order",
}


@dataclass(frozen=True)
class OrderBy:
    """A resolved ``--order-by``: the column and the direction."""

    column: Column
    ascending: bool

    def __str__(self) -> str:
        return ("+" if self.ascending else "") + self.column.key


def orderable_keys() -> list[str]:
    return [c.key for c in COLUMNS if c.orderable]


def parse_order_by(spec: str) -> OrderBy:
    """``time``, ``+flops``, ``bandwidth`` ... → OrderBy. Plain is descending, ``+`` ascending."""
    if not isinstance(spec, str) or not spec.strip():
        raise TableOptionError(f"--order-by needs a column name, not {spec!r}")
    text = spec.strip()
    ascending = text.startswith("+")
    name = text.lstrip("+-").strip().lower()
    column = _LOOKUP.get(name)
    if column is None or not column.orderable:
        hint = _HINTS.get(name)
        if hint is None:
            close = get_close_matches(name, list(_LOOKUP), n=1)
            suggestion = _LOOKUP[close[0]].key if close else None
            hint = (f"did you mean '{suggestion}'?" if suggestion and _LOOKUP[close[0]].orderable
                    else f"choose one of {', '.join(orderable_keys())}")
        raise TableOptionError(f"cannot order by {name!r}: {hint}")
    return OrderBy(column, ascending)


def _shape_key(shapes: Any) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """Total elements of all shapes, then the dimensions: big tensors first when descending."""
    norm = tuple(s if s is not None else () for s in shapes or ())
    total = 0
    for shape in norm:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total, norm


def value_getter(column: Column) -> Callable[[Any], Any]:
    """The function reading ``column`` from an entry or row; None means unknown."""
    get = attrgetter(column.key)
    if column.kind == SHAPES:
        return lambda e: None if get(e) is None else _shape_key(get(e))
    if column.kind == TEXT:
        return lambda e: get(e)
    return get


def order_entries(entries: Sequence[Any], order: OrderBy) -> list[Any]:
    """``entries`` ordered by ``order``; unknown values last, ties in their given order."""
    get = value_getter(order.column)
    if order.column.key in ("time_s", "percent"):  # the common case, with no None to split off
        return sorted(entries, key=attrgetter("time_s"), reverse=not order.ascending)
    keyed = [(get(e), e) for e in entries]
    known = [pair for pair in keyed if pair[0] is not None]
    unknown = [e for v, e in keyed if v is None]
    known.sort(key=lambda pair: pair[0], reverse=not order.ascending)
    return [e for _, e in known] + unknown
