"""Node diffs: the node pairs of two profiles as arrays, each built as a ``NodeDiff`` only when read.

Why arrays: a diff of two 100,000-node profiles pairs 100,000 nodes and
prints ten, so pairs, times and their order are computed over arrays of node
positions (``analysis.match`` pairs them) and no NodeRecord is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from graphprof.analysis.diff_rows import (TIME_KEYS, DiffOrder, LazyRows, flops_delta, flops_objects, ordered_positions,
                                          ordered_times)
from graphprof.analysis.entries import ratio
from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.match import KINDS, ColumnCodes, MatchKind, match_frames
from graphprof.profile.model import GraphRecord, NodeRecord, Profile


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


class NodeDiffs(LazyRows[NodeDiff]):
    """Node pairs in their order, each built as a NodeDiff only when read.

    Why: a diff of two 100,000-node profiles pairs 100,000 nodes and prints
    ten; the pairs live as arrays (``Pairs``) and ``rows`` picks and orders them.
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: "Pairs", rows: np.ndarray) -> None:
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
class Pairs:
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
        return flops_delta(*self.flops(k))

    def changed(self) -> np.ndarray:
        """Per pair: unmatched, or its time or FLOPs differ at all (computed once)."""
        cached = self.memo.get("changed")
        if cached is not None:
            return cached
        out = (self.kind != 0) | (self.delta_time_s != 0)
        both = np.flatnonzero(~out)
        if len(both):
            fa = flops_objects(self.frames[0])[0][self.before[both]]
            fb = flops_objects(self.frames[1])[0][self.after[both]]
            out[both] = fa != fb
        self.memo["changed"] = out
        return out


def _is_host(graph: GraphRecord) -> bool:
    """The graph of host time around the captured graphs (zero_grad, gaps between segments)."""
    return graph.kind.value == "host" or graph.name == "host"


def _take(values: np.ndarray, index: np.ndarray, missing: Any) -> np.ndarray:
    """``values[index]`` with ``missing`` where the index is -1 (no such node)."""
    out = np.full(len(index), missing, dtype=values.dtype)
    known = index >= 0
    out[known] = values[index[known]]
    return out


def pair_nodes(before: Profile, after: Profile, frames: tuple[NodeFrame, NodeFrame], columns: ColumnCodes,
                ta: Sequence[float],
                tb: Sequence[float], keep_a: np.ndarray | None, keep_b: np.ndarray | None,
                ) -> tuple[Pairs, dict[str, int], list[tuple[str | None, str | None]], bool]:
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
    pairs = Pairs(frames, m.kind[rows], ia, ib, m.graph[rows], tuple(b or a or "" for a, b in names),
                   time_a, time_b, delta, all_a, all_b)
    return pairs, counts, names, shared


def _node_values(pairs: Pairs, key: str) -> list[Any]:
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


def order_nodes(pairs: Pairs, order: DiffOrder) -> np.ndarray:
    """Positions of the node pairs in ``order`` (as ``order_items`` would put their NodeDiffs)."""
    n = len(pairs.kind)
    if order.key == "id":
        rows = np.arange(n)
        return rows if order.ascending else rows[::-1].copy()
    if order.key in TIME_KEYS:
        return ordered_times(pairs.before_time_s, pairs.after_time_s, order)
    return np.asarray(ordered_positions(_node_values(pairs, order.key), order.ascending), dtype=np.int64)
