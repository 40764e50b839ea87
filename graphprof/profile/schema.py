"""What every value of a loaded profile must be: its type and its range, in one table.

Why bounds and not only types: JSON integers are unbounded and JSON floats
reach 1e308, so a type check alone lets through a tick of 10**400 (which
overflows the float conversion), a FLOP count no float holds, or step
times whose sum overflows ``math.fsum``. Every number a profile holds is
therefore bounded here, once, at load; analysis and rendering may then add,
convert and print without guarding each use.

Checks run once per column with C-level passes (``set(map(type, ...))``, or
for integers one conversion to an int64 array, and its ``min``/``max``), never per cell
with Python objects, so validating a million-node profile costs a few of the
loader's list passes.

The bounds are far beyond anything a profile records and far inside what
floats and 64-bit integers hold:

* counts (bytes moved, FLOPs): integers in [0, 2**63); modelled memory figures
  in [-2**63, 2**63);
* ids and step indices: integers in [-2**63, 2**63);
* times: seconds in [-1e9, 1e9] (31 years; negative only for per-node samples,
  where two clocks' skew can make one), so a sum of a million of them is exact
  enough and far from overflow;
* peaks and rates: finite, in [0, 1e30].

Below a spec's ``tiny`` a number is read as 0: a time under a femtosecond
(the finest tick the column layout takes) or a peak under one per second is
no measurement, and dividing by a subnormal such as 5e-324 would turn a
finite FLOP count into an infinite rate that no JSON writer accepts.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import orjson

from graphprof.profile.records import AttrValue, typed_attr

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_SECONDS = 1e9
MAX_RATE = 1e30
MAX_TICKS_PER_S = 10**15  # a femtosecond tick; the writer uses records.NS_PER_S, files before it 10**10


class SchemaError(ValueError):
    """A value that does not meet the schema; the message names it, the caller adds where."""


@dataclass(frozen=True)
class IntSpec:
    """Integers in [lo, hi]; ``what`` finishes the sentence "... must hold ..."."""

    lo: int
    hi: int
    what: str


@dataclass(frozen=True)
class FloatSpec:
    """Finite numbers (JSON integers or floats) in [lo, hi]."""

    lo: float
    hi: float
    what: str
    tiny: float = 0.0

    def clean(self, value: float) -> float:
        """``value`` as a float, 0.0 when its magnitude is below ``tiny``."""
        return 0.0 if -self.tiny < value < self.tiny else float(value)


COUNT = IntSpec(0, INT64_MAX, "integers from 0 to 2**63-1")
#: Modelled memory figures: running sums of the memory model, so a modelling error can make
#: one negative; that is shown as is rather than a reason to refuse the file.
BYTES = IntSpec(INT64_MIN, INT64_MAX, "64-bit integers")
ID = IntSpec(INT64_MIN, INT64_MAX, "64-bit integers")
FLAG = IntSpec(0, 1, "0 or 1")
MIN_SECONDS = 1e-15  # 1 / MAX_TICKS_PER_S
#: Node samples in nanoseconds: the same -1e9..1e9 seconds as SAMPLE_SECONDS.
SAMPLE_NS = IntSpec(-int(MAX_SECONDS) * 10**9, int(MAX_SECONDS) * 10**9, "times from -1e9 to 1e9 seconds in ns")
SECONDS = FloatSpec(0.0, MAX_SECONDS, "times from 0 to 1e9 seconds", MIN_SECONDS)
SAMPLE_SECONDS = FloatSpec(-MAX_SECONDS, MAX_SECONDS, "times from -1e9 to 1e9 seconds", MIN_SECONDS)
RATE = FloatSpec(0.0, MAX_RATE, "finite numbers from 0 to 1e30", 1.0)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SchemaError(what)


def ints(values: Any, spec: IntSpec, what: str, n: int | None = None, nullable: bool = False) -> list[Any]:
    """``values`` when it is a list (of ``n`` items) of integers meeting ``spec`` (or null)."""
    return checked_ints(values, spec, what, n, nullable)[0]


def checked_ints(values: Any, spec: IntSpec, what: str, n: int | None = None,
                 nullable: bool = False) -> tuple[list[Any], np.ndarray | None]:
    """``ints``, and the values as the int64 array the range check made of them (None when one is null).

    Why: the analyses want integer columns as arrays (``int_array``); the
    check converts them anyway, so a loaded column keeps its array.
    """
    check(isinstance(values, list) and (n is None or len(values) == n),
          f"{what} must be a list" + (f" of {n} values" if n is not None else ""))
    failure = f"{what} must hold {spec.what}"
    packed = int64_array(values)
    if packed is not None:
        return values, within(packed, spec.lo, spec.hi, failure)
    types = set(map(type, values))
    allowed = {int, type(None)} if nullable else {int}
    check(types <= allowed, f"{what} holds a value of the wrong type")
    if type(None) in types:
        nums = [v for v in values if v is not None]
        if nums:
            check(min(nums) >= spec.lo and max(nums) <= spec.hi, failure)
        return values, None
    return values, in_range(values, spec.lo, spec.hi, failure)


def int64_array(values: list[Any]) -> np.ndarray | None:
    """``values`` as an int64 array when every one is an int (not a bool) that 64 bits hold, else None.

    Why: a column's type check (``set(map(type, ...))``) and its conversion
    were two passes over 100,000 Python objects, a third of a profile's
    validation. ``array("q", ...)`` is one C pass that refuses every
    non-integer JSON gives (floats, strings, null, lists) and every int
    beyond 64 bits; only bools pass as 0 and 1, so the values the array holds
    as 0 or 1 (all of them when those are over a quarter) are looked at
    again, as orjson's text: a C pass that writes an int as a digit and a
    bool as ``true`` or ``false``, three times faster than collecting their
    types. A caller given None takes its exact path, whose sentence names
    the fault.
    """
    try:
        packed = array("q", values)
    except (TypeError, OverflowError):
        return None
    out = np.frombuffer(packed, dtype=np.int64)
    zero_or_one = np.flatnonzero((out >> 1) == 0)
    if len(zero_or_one):
        looked_at = values if 4 * len(zero_or_one) > len(values) else list(map(values.__getitem__,
                                                                                zero_or_one.tolist()))
        if b"e" in orjson.dumps(looked_at):  # true or false: no digit has an e
            return None
    return out


def within(values: np.ndarray, lo: int, hi: int, failure: str) -> np.ndarray:
    """``values`` when all are in [lo, hi]; SchemaError(``failure``) when one is not."""
    if len(values):
        check(int(values.min()) >= lo and int(values.max()) <= hi, failure)
    return values


def in_range(values: list[int], lo: int, hi: int, failure: str) -> np.ndarray:
    """``values`` (integers: their types are checked already) as an int64 array, when all are in
    [lo, hi]; SchemaError(``failure``) when one is not.

    One conversion and two array reductions: about half the time of Python's
    ``min`` and ``max`` over the list, and the caller may keep the array.
    ``np.fromiter`` converts a list of known ints about a fifth faster than
    ``np.array`` (which first looks at every item to find the array's shape).
    """
    try:
        converted = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:  # beyond 64 bits, so beyond every bound
        raise SchemaError(failure) from None
    return within(converted, lo, hi, failure)


def one_int(value: Any, spec: IntSpec, what: str) -> int:
    check(type(value) is int, f"{what} must be an integer")
    check(spec.lo <= value <= spec.hi, f"{what} must be one of the {spec.what}")
    return value


def floats(values: Any, spec: FloatSpec, what: str) -> list[float]:
    """``values`` (a list of JSON numbers meeting ``spec``) as floats."""
    check(isinstance(values, list), f"{what} must be a list")
    check(set(map(type, values)) <= {int, float}, f"{what} must hold numbers")
    if values:
        # A float comparison with an int too large for a float is still exact in Python;
        # NaN fails both comparisons, so one min/max pass rejects NaN, infinities and range.
        lo, hi = min(values), max(values)
        check(lo >= spec.lo and hi <= spec.hi and not any(v != v for v in values), f"{what} must hold {spec.what}")
    return [spec.clean(v) for v in values]


def one_float(value: Any, spec: FloatSpec, what: str) -> float:
    check(type(value) in (int, float), f"{what} must be a number")
    check(spec.lo <= value <= spec.hi, f"{what} must be one of the {spec.what}")
    return spec.clean(value)


def string(value: Any, what: str) -> str:
    check(type(value) is str, f"{what} must be a string")
    return value


def strings(values: Any, what: str, n: int | None = None) -> list[str]:
    check(isinstance(values, list) and (n is None or len(values) == n),
          f"{what} must be a list" + (f" of {n} values" if n is not None else ""))
    check(set(map(type, values)) <= {str}, f"{what} must hold strings")
    return values


def mapping(value: Any, what: str) -> dict[str, Any]:
    check(isinstance(value, dict), f"{what} must be an object")
    return value


def count_map(value: Any, what: str) -> dict[str, int]:
    """A JSON object of modelled byte figures keyed by name."""
    mapping(value, what)
    ints(list(value.values()), BYTES, what)
    return value


def rate_map(value: Any, what: str) -> dict[str, float]:
    """A JSON object of finite non-negative rates (peaks) keyed by name."""
    mapping(value, what)
    return dict(zip(value, floats(list(value.values()), RATE, what)))


def ticks(rows: Any, ticks_per_s: int, what: str, n: int | None = None) -> list[list[int]]:
    """``rows``: a list of tick lists (each of ``n`` ticks) whose seconds meet SAMPLE_SECONDS."""
    check(isinstance(rows, list), f"{what} must be a list")
    limit = int(MAX_SECONDS * ticks_per_s)
    for i, row in enumerate(rows):
        check(isinstance(row, list) and (n is None or len(row) == n), f"{what}[{i}] must be a list of {n} values")
        check(set(map(type, row)) <= {int}, f"{what} holds a tick of the wrong type")
        if row:
            check(min(row) >= -limit and max(row) <= limit, f"{what} must hold ticks of -1e9 to 1e9 seconds")
    return rows


def tick_table(rows: Any, ticks_per_s: int, what: str, n: int) -> np.ndarray:
    """``ticks`` of rows that all hold ``n`` ticks, as an int64 array of rows x ``n``: each row is
    checked as ``ticks`` checks it, in the same order, its range over the row's array."""
    check(isinstance(rows, list), f"{what} must be a list")
    limit = int(MAX_SECONDS * ticks_per_s)
    arrays = []
    for i, row in enumerate(rows):
        check(isinstance(row, list) and len(row) == n, f"{what}[{i}] must be a list of {n} values")
        failure = f"{what} must hold ticks of -1e9 to 1e9 seconds"
        packed = int64_array(row)
        if packed is not None:
            arrays.append(within(packed, -limit, limit, failure))
            continue
        check(set(map(type, row)) <= {int}, f"{what} holds a tick of the wrong type")
        arrays.append(in_range(row, -limit, limit, failure))
    return np.stack(arrays) if arrays else np.zeros((0, n), dtype=np.int64)


def _attr_value(value: Any) -> bool:
    """An op attribute's value in a file: text, a bool, an int64 or a finite float."""
    if type(value) in (str, bool):
        return True
    if type(value) is int:
        return INT64_MIN <= value <= INT64_MAX
    return type(value) is float and math.isfinite(value)


def pairs(values: Any, what: str, n: int) -> list[tuple[tuple[str, AttrValue], ...]]:
    """A column of [[key, value], ...] op attributes as typed tuples (old files' text counts/flags typed)."""
    check(isinstance(values, list) and len(values) == n, f"{what} must be a list of {n} values")
    out: list[tuple[tuple[str, AttrValue], ...]] = []
    for row in values:
        check(isinstance(row, list) and all(
            isinstance(p, list) and len(p) == 2 and type(p[0]) is str and _attr_value(p[1]) for p in row),
            f"{what} must hold lists of [key, value] pairs (values text, numbers or booleans)")
        out.append(tuple((p[0], typed_attr(p[0], p[1])) for p in row) if row else ())
    return out


def meta_fields(raw: Mapping[str, Any], specs: Mapping[str, Any]) -> dict[str, Any]:
    """The known fields of a meta object, each checked against its spec (str, FloatSpec or a checker)."""
    out: dict[str, Any] = {}
    for key, spec in specs.items():
        if key not in raw:
            continue
        value, what = raw[key], f"meta.{key}"
        if spec is str:
            out[key] = string(value, what)
        elif isinstance(spec, FloatSpec):
            out[key] = one_float(value, spec, what)
        else:
            out[key] = spec(value, what)
    return out
