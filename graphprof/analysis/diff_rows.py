"""What node and group diffs share: the diff's order keys, the lazily built rows, and ordering by times.

Why a module of its own: node diffs (``diff_nodes``) and group diffs
(``diff_groups``) are both kept as arrays and built only when read, and both
are ordered by the same keys; the rule for each lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence, TypeVar, overload

import numpy as np

from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.node_arrays import int_array
from graphprof.analysis.options import TableOptionError

#: ``--order-by`` keys of a diff and their aliases. ``time`` and ``flops`` order by absolute change.
ORDER_KEYS: dict[str, tuple[str, ...]] = {
    "time": ("abs_delta_time", "abs_delta_time_s"),
    "delta_time": ("delta_time_s",),
    "ratio": (),
    "before_time": ("before", "before_time_s"),
    "after_time": ("after", "after_time_s"),
    "flops": ("abs_delta_flops",),
    "delta_flops": (),
    "type": (), "module": (), "phase": (), "status": (), "graph": (),
    "id": ("position", "opr_id"),  # execution order (groups: first seen)
}


@dataclass(frozen=True)
class DiffOrder:
    """A resolved diff ``--order-by``: a key of ``ORDER_KEYS`` and the direction."""

    key: str
    ascending: bool = False

    def __str__(self) -> str:
        return ("+" if self.ascending else "") + self.key


def parse_diff_order(text: str) -> DiffOrder:
    """``[+]KEY`` with a key or alias of ``ORDER_KEYS``; TableOptionError otherwise."""
    ascending = text.startswith("+")
    name = text[1:] if ascending else text
    for key, aliases in ORDER_KEYS.items():
        if name == key or name in aliases:
            return DiffOrder(key, ascending)
    raise TableOptionError(f"--order-by {text!r} is not a diff column; choose one of {', '.join(ORDER_KEYS)}")


def flops_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before



_T = TypeVar("_T")
_Rows = TypeVar("_Rows", bound="LazyRows[Any]")


class LazyRows(Sequence[_T]):
    """Items kept as rows of arrays and built only when read; ``rows`` picks and orders them.

    A slice is the same kind of view over fewer rows; two views are equal
    when their items are (to each other or to any sequence of the same items).
    """

    __slots__ = ("_rows",)
    _rows: np.ndarray

    def _item(self, row: int) -> _T:
        raise NotImplementedError

    def _with_rows(self: _Rows, rows: np.ndarray) -> _Rows:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self: _Rows, index: slice) -> _Rows: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return self._with_rows(self._rows[index])
        return self._item(int(self._rows[index]))

    def __iter__(self) -> Iterator[_T]:
        return map(self._item, self._rows.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == len(self) and all(x == y for x, y in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


def objects(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def flops_objects(frame: NodeFrame) -> tuple[np.ndarray, np.ndarray | None]:
    """The FLOPs column as an object array (exact Python values), and as int64 when every count is a
    known int small enough that any sum of them fits (None otherwise)."""
    def compute() -> tuple[np.ndarray, np.ndarray | None]:
        flops = frame.column("flops")
        exact: np.ndarray | None = None
        try:
            values, known = int_array(frame, "flops")  # the loader's array where the file gave one
        except ValueError:  # not all integers (or beyond int64)
            pass
        else:
            exact = values if known.all() else None
            if exact is not None and len(exact) and int(np.abs(exact).max()) * len(exact) >= 1 << 62:
                exact = None
        return objects(flops), exact
    return frame.memo("diff.flops_objects", compute)


#: Order keys that sort by times alone (numbers, both sides known for groups).
TIME_KEYS = ("time", "delta_time", "before_time", "after_time", "ratio")


def _time_values(before: np.ndarray, after: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Values of a ``TIME_KEYS`` order key from both sides' times (NaN: no such side) and where they are known."""
    known = ~np.isnan(before) & ~np.isnan(after)
    if key in ("time", "delta_time"):
        delta = np.where(np.isnan(after), 0.0, after) - np.where(np.isnan(before), 0.0, before)
        return (np.abs(delta) if key == "time" else delta), np.ones(len(before), dtype=bool)
    if key == "before_time":
        return before, ~np.isnan(before)
    if key == "after_time":
        return after, ~np.isnan(after)
    known &= before > 0
    values = np.zeros(len(before))
    values[known] = after[known] / before[known]
    return values, known


def ordered_times(before: np.ndarray, after: np.ndarray, order: DiffOrder) -> np.ndarray:
    """Positions in ``order`` (a ``TIME_KEYS`` key): unknown values last, ties in their order."""
    values, known = _time_values(before, after, order.key)
    rows = np.flatnonzero(known)
    # a stable sort of the negated values is the stable descending sort (no NaN among known values)
    rows = rows[np.argsort(values[rows] if order.ascending else -values[rows], kind="stable")]
    return np.concatenate((rows, np.flatnonzero(~known)))


def ordered_positions(values: Sequence[Any], ascending: bool) -> list[int]:
    """Positions of ``values`` in order; unknown (None) values last in either direction; ties keep their order."""
    known = [(v, i) for i, v in enumerate(values) if v is not None]
    known.sort(key=lambda vi: vi[0], reverse=not ascending)
    return [i for _, i in known] + [i for i, v in enumerate(values) if v is None]
