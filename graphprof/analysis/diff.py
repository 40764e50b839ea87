"""The diff of two profiles: what got slower, faster, added or removed, node by node.

``diff(before, after)`` pairs the graphs and nodes of two profiles
(``analysis.match`` documents the rule), then gives for every node pair the
time under a statistic on both sides, its delta and ratio, and the FLOPs
delta; nodes only in one profile are ``added`` or ``removed``. Aggregates by
op type, module and phase, total time, FLOPs and median step time deltas
come with it, and ``--fail-if-slower`` turns the step comparison into a CI
gate (``analysis.regression``). Torch-free: it runs on saved profiles.

Choices:

* **Node by node where graphs match, by op type and module otherwise**
  (DESIGN §6): when no pair of captured graphs shares a single node (a
  whole-step profile against a segmented one, two different programs; the
  host-time graph does not count), ``mode`` is
  ``"aggregate"``, the node list is empty and the aggregates carry the diff.
* **Changed** is exact: a node pair is changed when it is not ``matched``
  or its time or FLOPs differ at all. Two identical profiles have no
  changed node and every delta is exactly 0.
* **Filters** (``--type``, ``--module``, ``--phase``, ``--min-time`` ...) are
  those of ``graphprof analyze`` and select single nodes of each profile; a
  node pair is kept when either side is selected. Aggregates sum the
  selected nodes of each profile; totals in the summary ignore filters, as
  in ``analyze``.
* **Order:** by absolute time change by default (``time``); ties keep
  execution order; unknown values sort last (see ``ORDER_KEYS``).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar, overload

import numpy as np

from graphprof.analysis.aggregate import truncate_module
from graphprof.analysis.entries import ratio
from graphprof.analysis.filters import resolve_clock, select, why_empty
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.match import KINDS, ColumnCodes, MatchKind, match_frames
from graphprof.analysis.node_arrays import paired_codes
from graphprof.analysis.options import TableOptionError, TableOptions, make_options
from graphprof.analysis.regression import RegressionGate, StepComparison, compare_steps, regression_gate
from graphprof.profile.model import GraphRecord, NodeRecord, Profile

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
#: Groupings of the aggregate tables every diff carries (``--aggregate-by`` may add another).
DEFAULT_AGGREGATES = ("type", "module", "phase")


@dataclass(frozen=True)
class DiffOrder:
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


def _flops_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


@dataclass(frozen=True)
class NodeDiff:
    """A node of either profile, paired with its counterpart when it has one.

    ``before_index``/``after_index`` are the node's position in its profile's
    node frame (execution order over all graphs), None on the side where the
    node does not exist; ``side``/``value`` read a column there without
    building NodeRecords. Times are the chosen statistic over each profile's
    steps (None where the node does not exist); ``delta_time_s`` counts a
    missing side as 0, so an added node's delta is its whole time. ``ratio``
    is after / before time (None unless both are known and before > 0).
    """

    status: MatchKind
    graph: str
    before_index: int | None
    after_index: int | None
    before_time_s: float | None
    after_time_s: float | None
    delta_time_s: float
    ratio: float | None
    delta_flops: float | None
    position: int
    frames: tuple[NodeFrame, NodeFrame] = field(compare=False, repr=False)

    def side(self, name: str, which: str) -> Any:
        """Column ``name`` of the ``before`` or ``after`` node (None when that side has no node)."""
        index = self.before_index if which == "before" else self.after_index
        if index is None:
            return None
        return self.frames[0 if which == "before" else 1].column(name)[index]

    def value(self, name: str) -> Any:
        """Column ``name`` of the after node, or of the before node of a removed one."""
        return self.side(name, "after" if self.after_index is not None else "before")

    @property
    def before(self) -> NodeRecord | None:
        return None if self.before_index is None else self.frames[0].pairs[self.before_index][1]

    @property
    def after(self) -> NodeRecord | None:
        return None if self.after_index is None else self.frames[1].pairs[self.after_index][1]

    @property
    def node(self) -> NodeRecord:
        """The after node, or the before node of a removed one (for descriptive fields)."""
        return self.after if self.after is not None else self.before  # type: ignore[return-value]

    @property
    def changed(self) -> bool:
        """Not an identical node: unmatched, or time or FLOPs differ at all."""
        if self.status is not MatchKind.MATCHED or self.delta_time_s != 0:
            return True
        return self.side("flops", "before") != self.side("flops", "after")


_T = TypeVar("_T")
_Rows = TypeVar("_Rows", bound="_LazyRows[Any]")


class _LazyRows(Sequence[_T]):
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


class NodeDiffs(_LazyRows[NodeDiff]):
    """Node pairs in their order, each built as a NodeDiff only when read.

    Why: a diff of two 100,000-node profiles pairs 100,000 nodes and prints
    ten; the pairs live as arrays (``_Pairs``) and ``rows`` picks and orders them.
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: "_Pairs", rows: np.ndarray) -> None:
        self._pairs, self._rows = pairs, rows

    def _item(self, row: int) -> NodeDiff:
        return self._pairs.node_diff(row)

    def _with_rows(self, rows: np.ndarray) -> "NodeDiffs":
        return NodeDiffs(self._pairs, rows)

    def __repr__(self) -> str:
        return f"NodeDiffs({len(self)} node pairs)"

    def changed(self) -> "NodeDiffs":
        """The pairs that are not identical (``NodeDiff.changed``), in this order."""
        return self._with_rows(self._rows[self._pairs.changed()[self._rows]])


@dataclass(frozen=True)
class _Pairs:
    """The kept node pairs of a diff as arrays, by position (execution order); -1 / NaN: no such side."""

    frames: tuple[NodeFrame, NodeFrame]
    kind: np.ndarray
    before: np.ndarray
    after: np.ndarray
    graph: np.ndarray
    graph_names: tuple[str, ...]
    before_time_s: np.ndarray
    after_time_s: np.ndarray
    delta_time_s: np.ndarray
    before_times: np.ndarray  # every node's time in each profile, by node index
    after_times: np.ndarray
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def node_diff(self, k: int) -> NodeDiff:
        """The NodeDiff of pair ``k`` (built once: reading it twice gives the same object)."""
        built = self.memo.setdefault("nodes", {})
        out = built.get(k)
        if out is None:
            out = built[k] = self._build(k)
        return out

    def _build(self, k: int) -> NodeDiff:
        i, j = int(self.before[k]), int(self.after[k])
        ta = float(self.before_time_s[k]) if i >= 0 else None
        tb = float(self.after_time_s[k]) if j >= 0 else None
        return NodeDiff(KINDS[self.kind[k]], self.graph_names[self.graph[k]], i if i >= 0 else None,
                        j if j >= 0 else None, ta, tb, float(self.delta_time_s[k]), ratio(tb, ta),
                        self.delta_flops(k), k, self.frames)

    def flops(self, k: int) -> tuple[Any, Any]:
        """FLOPs of both sides of pair ``k``; a missing side counts as 0 (an added node's delta is its FLOPs)."""
        i, j = int(self.before[k]), int(self.after[k])
        return (self.frames[0].column("flops")[i] if i >= 0 else 0,
                self.frames[1].column("flops")[j] if j >= 0 else 0)

    def delta_flops(self, k: int) -> float | None:
        fa, fb = self.flops(k)
        return None if fa is None or fb is None else fb - fa

    def changed(self) -> np.ndarray:
        """Per pair: unmatched, or its time or FLOPs differ at all (computed once)."""
        cached = self.memo.get("changed")
        if cached is not None:
            return cached
        out = (self.kind != 0) | (self.delta_time_s != 0)
        both = np.flatnonzero(~out)
        if len(both):
            fa = _flops_objects(self.frames[0])[0][self.before[both]]
            fb = _flops_objects(self.frames[1])[0][self.after[both]]
            out[both] = fa != fb
        self.memo["changed"] = out
        return out


def _objects(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


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
        return _flops_delta(self.before_flops, self.after_flops)


class GroupDiffs(_LazyRows[GroupDiff]):
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
                   | (np.asarray(na) != np.asarray(nb)) | (_objects(fa) != _objects(fb)))
        rows = self._rows[changed[self._rows]] if len(self._rows) else self._rows
        return self._with_rows(rows)


_GROUP_DIFF_FIELDS = tuple(f.name for f in fields(GroupDiff))
_new = object.__new__


@dataclass(frozen=True)
class SideSummary:
    """Totals of one profile (filters ignored): what the summary compares."""

    function: str
    device: str
    graphs: int
    nodes: int
    steps: int
    total_time_s: float
    total_flops: int | None


@dataclass(frozen=True)
class DiffResult:
    """Everything a diff renderer needs. ``nodes`` and each aggregate are ordered, not cut to ``top``.

    ``mode`` is ``"nodes"`` (node by node) or ``"aggregate"`` (no shared
    graph structure: ``nodes`` is empty). ``counts`` gives the pairs of
    every status over all nodes, filters ignored; ``graph_pairs`` the graph
    names paired (None: a graph only in one profile).
    """

    options: TableOptions
    order: DiffOrder
    clock: str
    mode: str
    before: SideSummary
    after: SideSummary
    steps: StepComparison
    graph_pairs: tuple[tuple[str | None, str | None], ...]
    counts: Mapping[str, int]
    nodes: Sequence[NodeDiff]
    aggregates: Mapping[str, Sequence[GroupDiff]]
    gate: RegressionGate | None = None
    note: str | None = None

    @property
    def changed(self) -> Sequence[NodeDiff]:
        """The node pairs (after filters) that are not identical, in order."""
        if isinstance(self.nodes, NodeDiffs):
            return self.nodes.changed()
        return tuple(n for n in self.nodes if n.changed)

    @property
    def delta_time_s(self) -> float:
        return self.after.total_time_s - self.before.total_time_s

    @property
    def delta_flops(self) -> float | None:
        return _flops_delta(self.before.total_flops, self.after.total_flops)


def _clock(before: Profile, after: Profile, clock: str) -> str:
    """The clock both sides are compared on: the one both resolve to (``device`` or ``auto``, each
    node on its own clock), else host time for both (one side has no device times)."""
    a, b = resolve_clock(before, clock), resolve_clock(after, clock)
    if a == b:
        return a
    return "host" if "host" in (a, b) else "auto"


def _side(profile: Profile, frame: NodeFrame, times: Sequence[float]) -> SideSummary:
    flops = frame.column("flops")
    unknown = flops.count(None)
    total = None if unknown == len(flops) else sum(flops) if not unknown else sum([f for f in flops if f is not None])
    meta = profile.meta
    return SideSummary(meta.function, meta.device_type + (f" ({meta.device_name})" if meta.device_name else ""),
                       len(profile.graphs), len(times), len(profile.steps), math.fsum(times), total)


def _is_host(graph: GraphRecord) -> bool:
    """The graph of host time around the captured graphs (zero_grad, gaps between segments)."""
    return graph.kind.value == "host" or graph.name == "host"


def _take(values: np.ndarray, index: np.ndarray, missing: Any) -> np.ndarray:
    """``values[index]`` with ``missing`` where the index is -1 (no such node)."""
    out = np.full(len(index), missing, dtype=values.dtype)
    known = index >= 0
    out[known] = values[index[known]]
    return out


def _pair_nodes(before: Profile, after: Profile, frames: tuple[NodeFrame, NodeFrame], columns: ColumnCodes,
                ta: Sequence[float],
                tb: Sequence[float], keep_a: np.ndarray | None, keep_b: np.ndarray | None,
                ) -> tuple[_Pairs, dict[str, int], list[tuple[str | None, str | None]], bool]:
    """The kept node pairs, counts per status (all nodes), graph names paired, and whether any node of a
    captured graph (not the host graph) found a partner. ``keep_*`` None: every node is kept."""
    m = match_frames(before.graphs, after.graphs, *frames, columns)
    counts = dict(zip((k.value for k in KINDS), np.bincount(m.kind, minlength=len(KINDS)).tolist()))
    names = [(before.graphs[gi].name if gi is not None else None, after.graphs[gj].name if gj is not None else None)
             for gi, gj in m.graph_pairs]
    captured = np.array([gi is not None and gj is not None and not _is_host(before.graphs[gi])
                         for gi, gj in m.graph_pairs], dtype=bool)
    shared = bool(np.any((m.before >= 0) & (m.after >= 0) & captured[m.graph])) if len(m.kind) else False
    rows = slice(None)
    if keep_a is not None or keep_b is not None:
        kept = np.zeros(len(m.kind), dtype=bool)
        for index, keep, n in ((m.before, keep_a, len(frames[0])), (m.after, keep_b, len(frames[1]))):
            mask = np.ones(n, dtype=bool) if keep is None else np.zeros(n, dtype=bool)
            if keep is not None:
                mask[keep] = True
            kept |= _take(mask, index, False)
        rows = np.flatnonzero(kept)  # type: ignore[assignment]
    ia, ib = m.before[rows], m.after[rows]
    all_a, all_b = np.asarray(ta, dtype=np.float64), np.asarray(tb, dtype=np.float64)
    time_a, time_b = _take(all_a, ia, np.nan), _take(all_b, ib, np.nan)
    delta = np.where(ib >= 0, time_b, 0.0) - np.where(ia >= 0, time_a, 0.0)
    pairs = _Pairs(frames, m.kind[rows], ia, ib, m.graph[rows], tuple(b or a or "" for a, b in names),
                   time_a, time_b, delta, all_a, all_b)
    return pairs, counts, names, shared


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
        # labels of the distinct module paths, re-coded in code order (first-seen order is kept)
        labels: dict[str, int] = {}
        remap = np.fromiter((labels.setdefault(truncate_module(v, module_depth), len(labels)) for v in values),
                            dtype=np.int64, count=len(values))
        return remap[codes_a], remap[codes_b], list(labels)
    va = _kept(_group_keys(by, module_depth, frames[0]), keep[0])
    vb = _kept(_group_keys(by, module_depth, frames[1]), keep[1])
    return paired_codes(va, vb)


def _flops_objects(frame: NodeFrame) -> tuple[np.ndarray, np.ndarray | None]:
    """The FLOPs column as an object array (exact Python values), and as int64 when every count is a
    known int small enough that any sum of them fits (None otherwise)."""
    def compute() -> tuple[np.ndarray, np.ndarray | None]:
        flops = frame.column("flops")
        exact: np.ndarray | None = None
        if set(map(type, flops)) <= {int}:
            try:
                exact = np.array(flops, dtype=np.int64)
            except OverflowError:
                exact = None
            if exact is not None and len(exact) and int(np.abs(exact).max()) * len(exact) >= 1 << 62:
                exact = None
        return _objects(flops), exact
    return frame.memo("diff.flops_objects", compute)


def _group_sums(codes: np.ndarray, groups: int, times: np.ndarray,
                flops: np.ndarray) -> tuple[list[int], list[float], list[int]]:
    """``_fold_groups`` for ``sum`` with every FLOP count a known int (``flops`` int64), without a call per group.

    Exact as the loop: a group of one node sums to its time, of two to the
    IEEE sum of both (correctly rounded, as math.fsum is), and only larger
    groups go through math.fsum; int64 FLOP sums cannot overflow (see
    ``_flops_objects``) and come back as Python ints.
    """
    counts = np.bincount(codes, minlength=groups)
    order = np.argsort(codes, kind="stable")
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
    order = np.argsort(codes, kind="stable")
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
    columns = columns or ColumnCodes(frame_a.column, frame_b.column)
    codes_a, codes_b, keys = _group_codes(by, module_depth, frames, columns, (keep_a, keep_b))
    sides: list[tuple[list[int], list[float], list[Any]]] = []
    for codes, frame, times, keep in ((codes_a, frame_a, ta, keep_a), (codes_b, frame_b, tb, keep_b)):
        times = np.asarray(times, dtype=np.float64)
        flops, exact = _flops_objects(frame)
        if keep is not None:
            times, flops, exact = times[keep], flops[keep], None if exact is None else exact[keep]
        if fn == "sum" and exact is not None and len(codes):
            sides.append(_group_sums(codes, len(keys), times, exact))
        else:
            sides.append(_fold_groups(codes, len(keys), times, flops, fn))
    (na, time_a, flops_a), (nb, time_b, flops_b) = sides
    rows = np.arange(len(keys))
    if order is not None and order.key in _TIME_KEYS:
        rows = _ordered_times(np.asarray(time_a, dtype=np.float64), np.asarray(time_b, dtype=np.float64), order)
    groups = GroupDiffs(by, keys, (na, nb, time_a, time_b, flops_a, flops_b), rows)
    return groups if order is None or order.key in _TIME_KEYS else order_items(groups, order)


#: Order keys that sort by times alone (numbers, both sides known for groups).
_TIME_KEYS = ("time", "delta_time", "before_time", "after_time", "ratio")


def _time_values(before: np.ndarray, after: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Values of a ``_TIME_KEYS`` order key from both sides' times (NaN: no such side) and where they are known."""
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


def _ordered_times(before: np.ndarray, after: np.ndarray, order: DiffOrder) -> np.ndarray:
    """Positions in ``order`` (a ``_TIME_KEYS`` key): unknown values last, ties in their order."""
    values, known = _time_values(before, after, order.key)
    rows = np.flatnonzero(known)
    # a stable sort of the negated values is the stable descending sort (no NaN among known values)
    rows = rows[np.argsort(values[rows] if order.ascending else -values[rows], kind="stable")]
    return np.concatenate((rows, np.flatnonzero(~known)))


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


def _ordered(values: Sequence[Any], ascending: bool) -> list[int]:
    """Positions of ``values`` in order; unknown (None) values last in either direction; ties keep their order."""
    known = [(v, i) for i, v in enumerate(values) if v is not None]
    known.sort(key=lambda vi: vi[0], reverse=not ascending)
    return [i for _, i in known] + [i for i, v in enumerate(values) if v is None]


def order_items(items: Sequence[Any], order: DiffOrder) -> list[Any]:
    """Items ordered by ``order``; unknown values last in either direction; ties keep their order."""
    return [items[i] for i in _ordered([_order_value(x, order.key) for x in items], order.ascending)]


def _node_values(pairs: _Pairs, key: str) -> list[Any]:
    """The values a non-time ``order`` sorts the node pairs by, None for unknown."""
    n = len(pairs.kind)
    if key in ("flops", "delta_flops"):
        deltas = [pairs.delta_flops(k) for k in range(n)]
        return deltas if key == "delta_flops" else [None if d is None else abs(d) for d in deltas]
    if key == "status":
        names = [k.value for k in KINDS]
        return [names[k] for k in pairs.kind.tolist()]
    if key == "graph":
        return [pairs.graph_names[g] for g in pairs.graph.tolist()]
    # a descriptive column of the after node, or of the before node of a removed one
    column_a, column_b = pairs.frames[0].column(key), pairs.frames[1].column(key)
    return [column_b[j] if j >= 0 else column_a[i] for i, j in zip(pairs.before.tolist(), pairs.after.tolist())]


def order_nodes(pairs: _Pairs, order: DiffOrder) -> np.ndarray:
    """Positions of the node pairs in ``order`` (as ``order_items`` would put their NodeDiffs)."""
    n = len(pairs.kind)
    if order.key == "id":
        rows = np.arange(n)
        return rows if order.ascending else rows[::-1].copy()
    if order.key in _TIME_KEYS:
        return _ordered_times(pairs.before_time_s, pairs.after_time_s, order)
    return np.asarray(_ordered(_node_values(pairs, order.key), order.ascending), dtype=np.int64)


def _as_profile(value: Profile | str | os.PathLike[str], which: str) -> Profile:
    if isinstance(value, Profile):
        return value
    if isinstance(value, (str, os.PathLike)):
        from graphprof.profile.model import load_profile, require_samples

        profile = load_profile(value)
        require_samples(profile, str(value))
        return profile
    raise TypeError(f"diff: {which} must be a Profile or a path to a profile file, not {type(value).__name__}")


def diff(before: Profile | str | os.PathLike[str], after: Profile | str | os.PathLike[str],
         options: TableOptions | None = None, *, order_by: str = "time", fail_if_slower: float | None = None,
         **table_options: Any) -> DiffResult:
    """Compare two profiles (or profile files): node pairs, aggregates, totals and, optionally, the regression gate.

    Table options are ``graphprof analyze``'s (``top``, ``type``, ``module``,
    ``phase``, ``aggregate_by``, ``stat``, ``clock`` ... as keywords, or a
    ``TableOptions``); ``order_by`` takes a key of ``ORDER_KEYS``;
    ``fail_if_slower`` (percent) adds ``gate``. A bad value raises ValueError
    with one sentence. Render with ``graphprof.render.diff_text.render_diff``.
    """
    a, b = _as_profile(before, "before"), _as_profile(after, "after")
    if options is None:
        options = make_options(**table_options)
    elif table_options:
        raise TypeError("pass either options or keyword options, not both")
    else:
        options.validate()
    order = parse_diff_order(order_by)
    clock = _clock(a, b, options.clock)
    frames = node_frame(a), node_frame(b)
    ta, tb = frames[0].times(options.stat, clock), frames[1].times(options.stat, clock)
    keep_a: np.ndarray | None = None  # None: every node
    keep_b: np.ndarray | None = None
    if options.filtered:
        keep_a = np.asarray(select(frames[0], options, ta), dtype=np.int64)  # the frame: filters read columns
        keep_b = np.asarray(select(frames[1], options, tb), dtype=np.int64)
    columns = ColumnCodes(frames[0].column, frames[1].column)  # shared by the matching and the groupings
    pairs, counts, names, shared = _pair_nodes(a, b, frames, columns, ta, tb, keep_a, keep_b)
    rows = order_nodes(pairs, order) if shared else np.zeros(0, dtype=np.int64)
    groupings = list(DEFAULT_AGGREGATES)
    if options.aggregated and (options.aggregate_by or "all") not in groupings:
        groupings.append(options.aggregate_by or "all")
    aggregates = {}
    for by in groupings:
        depth = options.module_depth if by == "module" else None
        groups = aggregate_diff(by, frames[0], frames[1], pairs.before_times, pairs.after_times, keep_a, keep_b,
                                options.aggregate_fn, depth, columns, order)
        aggregates[by] = groups if isinstance(groups, GroupDiffs) else tuple(groups)
    note = None
    if keep_a is not None and keep_b is not None and not len(keep_a) and not len(keep_b) and (
            len(frames[0]) or len(frames[1])):
        note = why_empty(b if len(frames[1]) else a, options)
    steps = compare_steps(a, b)
    return DiffResult(
        options=options, order=order, clock=clock, mode="nodes" if shared else "aggregate",
        before=_side(a, frames[0], ta), after=_side(b, frames[1], tb), steps=steps, graph_pairs=tuple(names),
        counts=counts, nodes=NodeDiffs(pairs, rows), aggregates=aggregates,
        gate=None if fail_if_slower is None else regression_gate(steps, fail_if_slower), note=note,
    )
