"""Group diffs: both profiles' nodes grouped by op type, module, phase ... and outer-joined on the group.

Why columns: grouping a 100,000-node profile by module gives tens of
thousands of groups and a diff prints the ten that changed most, so the
groups' counts, times and FLOPs live as columns and each ``GroupDiff`` is
built only when read. Sums stay exact: ``math.fsum`` for times, Python ints
for FLOPs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from graphprof.analysis.aggregate import truncate_module, truncated_codes
from graphprof.analysis.diff_rows import (TIME_KEYS, DiffOrder, LazyRows, flops_delta, flops_objects, objects,
                                          ordered_positions, ordered_times)
from graphprof.analysis.entries import ratio
from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.match import ColumnCodes
from graphprof.analysis.node_arrays import group_order, paired_codes
from graphprof.analysis.options import TableOptionError
from graphprof.profile.model import GraphRecord, NodeRecord

if TYPE_CHECKING:
    from graphprof.analysis.diff_nodes import NodeDiff


@dataclass(frozen=True)
class GroupDiff:
    """One group (an op type, a module, a phase ...) on both sides: node counts, folded time and FLOPs."""

    by: str
    key: str
    before_nodes: int
    after_nodes: int
    before_time_s: float
    after_time_s: float
    before_flops: float | None
    after_flops: float | None

    @property
    def delta_time_s(self) -> float:
        return self.after_time_s - self.before_time_s

    @property
    def ratio(self) -> float | None:
        return ratio(self.after_time_s, self.before_time_s)

    @property
    def delta_flops(self) -> float | None:
        return flops_delta(self.before_flops, self.after_flops)


class GroupDiffs(LazyRows[GroupDiff]):
    """The groups of one grouping in their order, each built as a GroupDiff only when read.

    Why: grouping a 100,000-node profile by module gives 30,000 groups and
    a diff prints the ten that changed most; the groups live as columns.
    """

    __slots__ = ("_by", "_keys", "_columns", "_built")

    def __init__(self, by: str, keys: Sequence[str], columns: tuple[list[Any], ...], rows: np.ndarray,
                 built: dict[int, GroupDiff] | None = None) -> None:
        self._by, self._keys, self._columns, self._rows = by, keys, columns, rows
        self._built = {} if built is None else built  # shared by views, so a group read twice is one object

    def _with_rows(self, rows: np.ndarray) -> "GroupDiffs":
        return GroupDiffs(self._by, self._keys, self._columns, rows, self._built)

    def _item(self, g: int) -> GroupDiff:
        out = self._built.get(g)
        if out is None:  # without the frozen __init__ (one object.__setattr__ per field)
            out = self._built[g] = _new(GroupDiff)
            out.__dict__.update(zip(_GROUP_DIFF_FIELDS, (self._by, self._keys[g], *(c[g] for c in self._columns))))
        return out

    def __repr__(self) -> str:
        return f"GroupDiffs({self._by!r}, {len(self)} groups)"

    def changed(self) -> "GroupDiffs":
        """The groups whose node count, time or FLOPs differ, in this order."""
        na, nb, ta, tb, fa, fb = self._columns
        # after - before != 0 exactly when after != before (IEEE floats, subnormals included)
        changed = ((np.asarray(tb, dtype=np.float64) != np.asarray(ta, dtype=np.float64))
                   | (np.asarray(na) != np.asarray(nb)) | (objects(fa) != objects(fb)))
        rows = self._rows[changed[self._rows]] if len(self._rows) else self._rows
        return self._with_rows(rows)


_GROUP_DIFF_FIELDS = tuple(f.name for f in fields(GroupDiff))
_new = object.__new__


def _shape_label(node: NodeRecord) -> str:
    return _shape_text(node.type, node.in_shapes)


def _shape_text(op_type: str, in_shapes: tuple[tuple[int, ...] | None, ...]) -> str:
    return f"{op_type} {[list(s) if s is not None else None for s in in_shapes]}"


def group_key_fn(by: str, module_depth: int | None = None) -> Callable[[GraphRecord, NodeRecord], str]:
    """The group of a node under ``--aggregate-by by`` (as text, so that both sides join on it)."""
    if by == "module" and module_depth:
        return lambda g, n: truncate_module(n.module, module_depth)
    simple: dict[str, Callable[[GraphRecord, NodeRecord], str]] = {
        "type": lambda g, n: n.type, "module": lambda g, n: n.module, "phase": lambda g, n: n.phase.value,
        "shape": lambda g, n: _shape_label(n), "graph": lambda g, n: g.name, "source": lambda g, n: n.source,
        "scope": lambda g, n: n.scope, "all": lambda g, n: "all",
    }
    if by not in simple:
        raise TableOptionError(f"--aggregate-by {by!r} is not supported by diff")
    return simple[by]


_FOLD: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": math.fsum, "mean": lambda xs: math.fsum(xs) / len(xs), "max": max, "min": min,
}


def _group_keys(by: str, module_depth: int | None, frame: NodeFrame) -> Sequence[str]:
    """``group_key_fn(by, module_depth)`` of every node of ``frame``, from its columns (labels made once per
    distinct value): a diff groups two 100,000-node profiles three ways or more."""
    if by == "all":
        return ["all"] * len(frame)
    if by in ("type", "module", "source", "scope", "phase", "graph") and not (by == "module" and module_depth):
        return frame.column(by)
    if by == "shape":
        pairs = list(zip(frame.column("type"), frame.column("in_shapes")))
        labels = {k: _shape_text(*k) for k in dict.fromkeys(pairs)}
        return [labels[k] for k in pairs]
    if by == "module":
        modules = frame.column("module")
        paths = {m: truncate_module(m, module_depth) for m in dict.fromkeys(modules)}
        return [paths[m] for m in modules]
    raise TableOptionError(f"--aggregate-by {by!r} is not supported by diff")


def _kept(values: Sequence[Any], keep: np.ndarray | None) -> Sequence[Any]:
    return values if keep is None else [values[i] for i in keep.tolist()]


def _group_codes(by: str, module_depth: int | None, frames: tuple[NodeFrame, NodeFrame], columns: ColumnCodes,
                 keep: tuple[np.ndarray | None, np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Group codes of the kept nodes of each side and the group keys in code order: the before profile's
    groups in first-seen order, then those only in the after profile (as a walk over the nodes meets them)."""
    if keep[0] is None and keep[1] is None and (by in ("type", "module", "source", "scope", "phase", "graph") or by == "all"):
        if by == "all":
            n_a, n_b = len(frames[0]), len(frames[1])
            return np.zeros(n_a, dtype=np.int64), np.zeros(n_b, dtype=np.int64), ["all"] if n_a + n_b else []
        codes_a, codes_b, values = columns(by)
        if by != "module" or not module_depth:
            return codes_a, codes_b, values
        remap, keys = truncated_codes(values, module_depth)  # first-seen order is kept
        return remap[codes_a], remap[codes_b], keys
    va = _kept(_group_keys(by, module_depth, frames[0]), keep[0])
    vb = _kept(_group_keys(by, module_depth, frames[1]), keep[1])
    return paired_codes(va, vb)


def _group_sums(codes: np.ndarray, groups: int, times: np.ndarray,
                flops: np.ndarray) -> tuple[list[int], list[float], list[int]]:
    """``_fold_groups`` for ``sum`` with every FLOP count a known int (``flops`` int64), without a call per group.

    Exact as the loop: a group of one node sums to its time, of two to the
    IEEE sum of both (correctly rounded, as math.fsum is), and only larger
    groups go through math.fsum; int64 FLOP sums cannot overflow (see
    ``flops_objects``) and come back as Python ints.
    """
    counts = np.bincount(codes, minlength=groups)
    order = group_order(codes, groups)
    ends = np.cumsum(counts)
    starts = ends - counts
    t = times[order]
    out = np.zeros(groups)
    one, two = counts == 1, counts == 2
    out[one] = t[starts[one]]
    out[two] = t[starts[two]] + t[starts[two] + 1]
    many = np.flatnonzero(counts > 2)
    if len(many):
        t_list = t.tolist()
        fsum = math.fsum
        out[many] = [fsum(t_list[s:e]) for s, e in zip(starts[many].tolist(), ends[many].tolist())]
    running = np.concatenate(([0], np.cumsum(flops[order])))
    return counts.tolist(), out.tolist(), (running[ends] - running[starts]).tolist()


def _fold_groups(codes: np.ndarray, groups: int, times: np.ndarray, flops: np.ndarray,
                 fn: str) -> tuple[list[int], list[float], list[float | None]]:
    """Per group code: node count, folded time and folded FLOPs (unknown FLOPs left out; int sums stay exact).

    Nodes are visited in execution order within each group, as a loop over the nodes would.
    """
    counts = np.bincount(codes, minlength=groups).tolist() if len(codes) else [0] * groups
    order = group_order(codes, groups)
    t = times[order].tolist()
    f = flops[order].tolist()
    bounds = [0, *itertools.accumulate(counts)]
    fold = _FOLD[fn]
    out_t: list[float] = []
    out_f: list[float | None] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if start == end:
            out_t.append(0.0)
            out_f.append(0)
            continue
        out_t.append(fold(t[start:end]))
        known = [x for x in f[start:end] if x is not None]
        out_f.append((sum(known) if fn == "sum" else fold(known)) if known else None)
    return counts, out_t, out_f


def aggregate_diff(by: str, frame_a: NodeFrame, frame_b: NodeFrame, ta: Sequence[float] | np.ndarray,
                   tb: Sequence[float] | np.ndarray, keep_a: np.ndarray | None, keep_b: np.ndarray | None,
                   fn: str = "sum", module_depth: int | None = None,
                   columns: ColumnCodes | None = None, order: DiffOrder | None = None) -> Sequence[GroupDiff]:
    """Groups of the kept nodes of each profile (``keep_*`` None: all), outer-joined on the group key
    (first-seen order: the before profile's groups, then those only in the after profile).

    A side without nodes in a group has 0 time and 0 FLOPs there, not unknown ones. ``columns``: the
    frames' ColumnCodes when the caller shares them (a diff groups three ways or more); ``order``: the
    groups in that order (as ``order_items`` puts them) instead of first-seen order.
    """
    group_key_fn(by, module_depth)  # an unsupported grouping fails here, with its sentence
    frames = (frame_a, frame_b)
    columns = columns or ColumnCodes.of_frames(frame_a, frame_b)
    codes_a, codes_b, keys = _group_codes(by, module_depth, frames, columns, (keep_a, keep_b))
    sides: list[tuple[list[int], list[float], list[Any]]] = []
    for codes, frame, times, keep in ((codes_a, frame_a, ta, keep_a), (codes_b, frame_b, tb, keep_b)):
        times = np.asarray(times, dtype=np.float64)
        flops, exact = flops_objects(frame)
        if keep is not None:
            times, flops, exact = times[keep], flops[keep], None if exact is None else exact[keep]
        if fn == "sum" and exact is not None and len(codes):
            sides.append(_group_sums(codes, len(keys), times, exact))
        else:
            sides.append(_fold_groups(codes, len(keys), times, flops, fn))
    (na, time_a, flops_a), (nb, time_b, flops_b) = sides
    rows = np.arange(len(keys))
    if order is not None and order.key in TIME_KEYS:
        rows = ordered_times(np.asarray(time_a, dtype=np.float64), np.asarray(time_b, dtype=np.float64), order)
    groups = GroupDiffs(by, keys, (na, nb, time_a, time_b, flops_a, flops_b), rows)
    return groups if order is None or order.key in TIME_KEYS else order_items(groups, order)


def _order_value(item: NodeDiff | GroupDiff, key: str) -> Any:
    if key == "time":
        return abs(item.delta_time_s)
    if key == "flops":
        return None if item.delta_flops is None else abs(item.delta_flops)
    if key in ("before_time", "after_time"):
        return getattr(item, key + "_s")
    if key in ("delta_time", "ratio", "delta_flops"):
        return getattr(item, "delta_time_s" if key == "delta_time" else key)
    if isinstance(item, GroupDiff):
        return item.key if key == item.by else None
    if key == "id":
        return item.position
    if key == "status":
        return item.status.value
    if key == "graph":
        return item.graph
    return item.value(key)


def order_items(items: Sequence[Any], order: DiffOrder) -> list[Any]:
    """Items ordered by ``order``; unknown values last in either direction; ties keep their order."""
    return [items[i] for i in ordered_positions([_order_value(x, order.key) for x in items], order.ascending)]
