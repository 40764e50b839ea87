"""The columns of a profile table: keys, aliases, kinds, and ordering by any of them.

A column key is the attribute of a table entry and row (``time_s``,
``flops``, ``live_bytes`` ...) and the field name in ``--format json/csv``.
``--order-by`` takes a key or an alias; ordering is generic over the kind of
column, so a new numeric column (say, from the memory pass) is orderable by
adding one line here.

Aliases carry the vocabulary users bring (README, "Names from other tools"):
MegEngine's profile_analyze (``computation``, ``memory`` = bytes of inputs
and outputs = ``bytes_moved``, ``opr_id``) and torch.profiler's
``key_averages()`` (``self_cpu_time_total``, ``cpu_memory_usage``,
``count``, the ``cuda_*``/``device_*`` names ...). One exception is kept on
purpose: ``flops`` is a count, as in key_averages, where MegEngine's
``flops`` column is a rate (``flop_per_s`` here).

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

from graphprof.analysis.option_errors import TableOptionError

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


#: torch.profiler's key_averages() time names. Nodes here are single aten ops with no
#: children, so self and total time are one figure; the clock (host or device) is --clock's.
_TORCH_TIME = tuple(f"{self_}{dev}_time{total}" for self_ in ("", "self_") for dev in ("cpu", "cuda", "device", "xpu")
                    for total in ("", "_total"))
#: key_averages() memory names: bytes the op allocates (modelled; what it keeps, as torch counts it).
_TORCH_MEMORY = tuple(f"{self_}{dev}_memory_usage" for self_ in ("", "self_") for dev in ("cpu", "cuda", "device", "xpu"))

COLUMNS: tuple[Column, ...] = (
    Column("time_s", "self time", unit="s", aliases=("time", "self_time", "self", *_TORCH_TIME)),
    Column("percent", "%", unit="%", aliases=("pct", "ratio")),
    Column("cumulative_percent", "cum %", unit="%", orderable=False, aliases=("cumulative", "cum")),
    Column("calls", "calls", unit="count", aliases=("count",)),
    Column("id", "id", unit="id", aliases=("opr_id", "node_id")),
    Column("flops", "FLOPs", unit="FLOP", aliases=("computation", "flop")),
    Column("flop_per_s", "FLOP/s", unit="FLOP/s", aliases=("flop_rate", "flop/s", "flops_per_s")),
    Column("bytes_moved", "bytes", unit="B", aliases=("bytes", "memory")),
    Column("bytes_read", "read", unit="B", aliases=("read",)),
    Column("bytes_written", "written", unit="B", aliases=("written",)),
    Column("bandwidth_bytes_per_s", "B/s", unit="B/s", aliases=("bandwidth", "bw")),
    Column("intensity_flop_per_byte", "FLOP/B", unit="FLOP/B", aliases=("intensity", "arithmetic_intensity")),
    Column("allocated_bytes", "alloc", unit="B", aliases=("allocated", "alloc", *_TORCH_MEMORY)),
    Column("freed_bytes", "freed", unit="B", aliases=("freed",)),
    Column("live_bytes", "live", unit="B", aliases=("live",)),
    Column("name", "node", TEXT, aliases=("opr_name", "node")),
    Column("type", "type", TEXT, aliases=("key", "opr_type")),
    Column("op", "op", TEXT),
    Column("module", "module", TEXT),
    Column("module_type", "module type", TEXT),
    Column("source", "source", TEXT, aliases=("stack",)),
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
    "cumulative_percent": "the cumulative share depends on the order, so it cannot be the order",
}


def find_column(name: str) -> Column | None:
    """The column a key or alias names (case-insensitive), or None."""
    return _LOOKUP.get(name.strip().lower())


def resolve_columns(names: Sequence[str]) -> tuple[str, ...]:
    """Column keys of ``--columns`` names (aliases allowed; ``all`` = every column), in order, once each."""
    keys: list[str] = []
    for name in names:
        if name.strip().lower() == "all":
            picked = [c.key for c in COLUMNS]
        else:
            column = find_column(name)
            if column is None:
                raise TableOptionError(f"--columns: no column {name!r}; {unknown_column(name.strip().lower())}")
            picked = [column.key]
        keys += [k for k in picked if k not in keys]
    return tuple(keys)


def unknown_column(name: str, what: str = "choose one of") -> str:
    """Why ``name`` is not a column, with the closest spelling: one sentence's tail."""
    close = get_close_matches(name, list(_LOOKUP), n=1)
    return f"did you mean '{_LOOKUP[close[0]].key}'?" if close else f"{what} {', '.join(c.key for c in COLUMNS)}"


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
    column = find_column(name)
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
