"""Matching the graphs and nodes of two profiles, for ``graphprof diff``.

A diff is only as good as its pairing of nodes: an op inserted early in the
forward pass must not shift every later node onto its neighbour. The rule,
applied to each pair of graphs:

1. **Exact alignment.** Each node gets an exact key ``(op, module, phase,
   in_shapes)``; the two key sequences (execution order) are aligned with
   ``difflib.SequenceMatcher`` (longest common blocks, recursively: an
   order-preserving alignment close to a longest common subsequence). Aligned
   nodes are ``MATCHED``: the same op on the same inputs of the same module.
2. **Loose passes over the gaps.** Between two aligned blocks, the nodes
   left on either side are aligned again on ``(op, phase, in_shapes)``: the
   same op on the same shapes under another module path, e.g. the layers
   after an inserted ``nn.Sequential`` entry, which are renumbered. In the
   smaller gaps that still remain they are aligned on ``(op type, module,
   phase)``: the same kind of op of the same module whose shapes (or
   overload) changed, e.g. every op of a layer whose width changed. Pairs
   found by either pass are ``MODIFIED``. Gaps stay local, so a leftover
   ``relu`` is never paired with one at the other end of the graph.
3. Whatever is still unpaired is ``REMOVED`` (only in the first profile) or
   ``ADDED`` (only in the second).

Keys are compared as interned integer codes computed once per column of
each profile's node frame (``match_frames``), so a diff of two large
profiles never walks NodeRecords; the record-based ``match_nodes`` and
``match_profiles`` compute the same codes from records.

Graphs pair by ``(name, kind)`` in order of appearance (a whole-step graph
``step``, segments, the ``host`` graph of segmented capture), then leftover
graphs of the same kind pair in order of id. A graph with no partner has
all its nodes removed or added.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.node_arrays import codes as value_codes
from graphprof.analysis.node_arrays import column_codes, merged_codes
from graphprof.profile.model import GraphRecord, NodeRecord


class MatchKind(str, enum.Enum):
    """How a node of one profile relates to the other profile."""

    MATCHED = "matched"    # same op, module, phase and input shapes
    MODIFIED = "modified"  # paired by a loose pass: module path, shapes or overload differ
    ADDED = "added"        # only in the second (after) profile
    REMOVED = "removed"    # only in the first (before) profile


#: The kinds in code order: ``ProfileMatch.kind`` holds indices into this tuple.
KINDS: tuple[MatchKind, ...] = tuple(MatchKind)
_MATCHED, _MODIFIED, _ADDED, _REMOVED = range(4)

#: (index in the before graph or None, index in the after graph or None, kind), in execution order.
NodePair = tuple["int | None", "int | None", MatchKind]
#: (index into the before profile's graphs or None, index into the after profile's graphs or None).
GraphPair = tuple["int | None", "int | None"]

#: The columns of each key: exact (aligned first), then the gap passes' keys, in order.
EXACT_KEY = ("op", "module", "phase", "in_shapes")
#: The same op on the same shapes whose module path changed (a layer inserted before it renumbers it).
SHAPE_KEY = ("op", "phase", "in_shapes")
#: The same op of a program whose shapes changed.
LOOSE_KEY = ("type", "module", "phase")
_GAP_KEYS = (SHAPE_KEY, LOOSE_KEY)  # every gap pass pairs as MODIFIED


def exact_key(node: NodeRecord) -> Hashable:
    """What must be equal for two nodes to be the same node of a program."""
    return node.op, node.module, node.phase.value, node.in_shapes


def loose_key(node: NodeRecord) -> Hashable:
    """What must be equal for two nodes to be the same op of a program whose shapes changed."""
    return node.type, node.module, node.phase.value


def shape_key(node: NodeRecord) -> Hashable:
    """The same op on the same shapes whose module path changed (a layer inserted before it renumbers it)."""
    return node.op, node.phase.value, node.in_shapes


class ColumnCodes:
    """Each column of two node frames as integer codes, computed once per column and shared by every key.

    Equal values get equal codes on both sides; codes follow first-seen
    order (the before profile's nodes, then the after profile's), so
    ``values[code]`` in code order is also the order a walk over the nodes
    would first meet each value.
    """

    def __init__(self, codes_a: Callable[[str], tuple[np.ndarray, list[Any]]],
                 codes_b: Callable[[str], tuple[np.ndarray, list[Any]]]) -> None:
        """``codes_*(name)``: one side's ``node_arrays.codes`` of column ``name``."""
        self._sides = (codes_a, codes_b)
        self._codes: dict[str, tuple[np.ndarray, np.ndarray, list[Any]]] = {}

    @classmethod
    def of_frames(cls, frame_a: NodeFrame, frame_b: NodeFrame) -> ColumnCodes:
        """The columns of two node frames, each side coded once per column (``column_codes``: from a
        loaded file's index columns, without a pass over the values)."""
        return cls(lambda name: column_codes(frame_a, name), lambda name: column_codes(frame_b, name))

    @classmethod
    def of_records(cls, before: Sequence[NodeRecord], after: Sequence[NodeRecord]) -> ColumnCodes:
        """The columns of two sequences of records."""
        column_a, column_b = _record_column(before), _record_column(after)
        return cls(lambda name: value_codes(column_a(name)), lambda name: value_codes(column_b(name)))

    def __call__(self, name: str) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """(codes of the before nodes, codes of the after nodes, the distinct values in code order)."""
        cached = self._codes.get(name)
        if cached is None:
            cached = self._codes[name] = merged_codes(self._sides[0](name), self._sides[1](name))
        return cached

    def key(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Codes of the tuple of columns ``names``: equal codes exactly where every column is equal."""
        parts = [self(c) for c in names]
        n = len(parts[0][0])
        both = _combine([np.concatenate(p[:2]) for p in parts])
        return both[:n], both[n:]


def _combine(parts: Sequence[np.ndarray]) -> np.ndarray:
    """One code per distinct tuple of the codes in ``parts`` (equal tuples, equal codes; not dense).

    Codes are mixed by multiplication while the product of the code ranges
    fits in 62 bits, and re-densified (a sort) only when it would not.
    """
    out = parts[0]
    for codes in parts[1:]:
        if not len(out):
            return out
        span = int(codes.max()) + 1
        if (int(out.max()) + 1) * span >= 1 << 62:
            out = np.unique(out, return_inverse=True)[1].reshape(-1).astype(np.int64)
        out = out * span + codes
    return out


def _align(a: np.ndarray, b: np.ndarray) -> list[tuple[str, int, int, int, int]]:
    """SequenceMatcher's opcodes over ``a`` and ``b``, with a common prefix and suffix taken off first.

    Trimming makes the usual case (two runs of the same program, a local
    change) linear and spares SequenceMatcher most of the sequence.
    """
    n, m = len(a), len(b)
    k = min(n, m)
    differ = np.flatnonzero(a[:k] != b[:k])
    lo = int(differ[0]) if len(differ) else k
    tail_a, tail_b = a[lo:][::-1], b[lo:][::-1]
    k = min(len(tail_a), len(tail_b))
    differ = np.flatnonzero(tail_a[:k] != tail_b[:k])
    same = int(differ[0]) if len(differ) else k
    hi_a, hi_b = n - same, m - same
    ops: list[tuple[str, int, int, int, int]] = []
    if lo:
        ops.append(("equal", 0, lo, 0, lo))
    if hi_a > lo or hi_b > lo:
        matcher = SequenceMatcher(None, a[lo:hi_a].tolist(), b[lo:hi_b].tolist(), autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            ops.append((tag, i1 + lo, i2 + lo, j1 + lo, j2 + lo))
    if hi_a < n:
        ops.append(("equal", hi_a, n, hi_b, m))
    return ops


_Chunks = list[tuple[np.ndarray, np.ndarray, int]]


def _unpaired(i1: int, i2: int, j1: int, j2: int, out: _Chunks) -> None:
    """Nodes without a partner: the before ones removed, then the after ones added."""
    if i2 > i1:
        out.append((np.arange(i1, i2), np.full(i2 - i1, -1), _REMOVED))
    if j2 > j1:
        out.append((np.full(j2 - j1, -1), np.arange(j1, j2), _ADDED))


def _gap_pairs(gap_codes: Sequence[tuple[np.ndarray, np.ndarray]], i1: int, i2: int, j1: int, j2: int,
               out: _Chunks, level: int = 0) -> None:
    """Pairs of one unaligned gap: aligned on the next pass's key, smaller gaps recursively, the rest unpaired."""
    if level == len(gap_codes) or i1 == i2 or j1 == j2:
        _unpaired(i1, i2, j1, j2, out)
        return
    ka, kb = gap_codes[level]
    for tag, a1, a2, b1, b2 in _align(ka[i1:i2], kb[j1:j2]):
        if tag == "equal":
            out.append((np.arange(i1 + a1, i1 + a2), np.arange(j1 + b1, j1 + b2), _MODIFIED))
        else:
            _gap_pairs(gap_codes, i1 + a1, i1 + a2, j1 + b1, j1 + b2, out, level + 1)


def match_codes(exact: tuple[np.ndarray, np.ndarray],
                gaps: Callable[[], Sequence[tuple[np.ndarray, np.ndarray]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The node pairs of one graph pair from its key codes: (before index or -1, after index or -1, kind code).

    ``exact`` holds the exact key codes of both graphs; ``gaps()`` the codes
    of each gap pass's key, in pass order (see the module docstring), asked
    for only when the exact alignment leaves gaps.
    """
    ka, kb = exact
    if len(ka) == len(kb) and np.array_equal(ka, kb):
        index = np.arange(len(ka))
        return index, index.copy(), np.zeros(len(ka), dtype=np.int8)
    chunks: _Chunks = []
    gap_codes: list[Sequence[tuple[np.ndarray, np.ndarray]]] = []
    for tag, i1, i2, j1, j2 in _align(ka, kb):
        if tag == "equal":
            chunks.append((np.arange(i1, i2), np.arange(j1, j2), _MATCHED))
        else:
            if not gap_codes:
                gap_codes.append(gaps())
            _gap_pairs(gap_codes[0], i1, i2, j1, j2, chunks)
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), np.zeros(0, dtype=np.int8)
    return (np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]),
            np.concatenate([np.full(len(c[0]), c[2], dtype=np.int8) for c in chunks]))


def _as_pairs(ia: np.ndarray, ib: np.ndarray, kind: np.ndarray) -> list[NodePair]:
    return [(None if i < 0 else i, None if j < 0 else j, KINDS[k])
            for i, j, k in zip(ia.tolist(), ib.tolist(), kind.tolist())]


def _record_column(nodes: Sequence[NodeRecord]) -> Callable[[str], list[Any]]:
    def column(name: str) -> list[Any]:
        return [n.phase.value for n in nodes] if name == "phase" else [getattr(n, name) for n in nodes]
    return column


def match_nodes(before: GraphRecord, after: GraphRecord) -> list[NodePair]:
    """Every node of both graphs, paired by the rule of this module's docstring, in execution order."""
    codes = ColumnCodes.of_records(before.nodes, after.nodes)
    return _as_pairs(*match_codes(codes.key(EXACT_KEY), lambda: [codes.key(k) for k in _GAP_KEYS]))


def match_graphs(before: Sequence[GraphRecord], after: Sequence[GraphRecord]) -> list[GraphPair]:
    """Indices of graphs paired by (name, kind), then leftovers by kind in id order; unpaired ones with None."""
    used: set[int] = set()
    partner: dict[int, int] = {}
    for i, g in enumerate(before):
        for j, h in enumerate(after):
            if j not in used and (h.name, h.kind) == (g.name, g.kind):
                partner[i] = j
                used.add(j)
                break
    for i, g in sorted(enumerate(before), key=lambda t: t[1].id):
        if i in partner:
            continue
        for j, h in sorted(enumerate(after), key=lambda t: t[1].id):
            if j not in used and h.kind == g.kind:
                partner[i] = j
                used.add(j)
                break
    pairs: list[GraphPair] = [(i, partner.get(i)) for i in range(len(before))]
    pairs.extend((None, j) for j in range(len(after)) if j not in used)
    return pairs


def match_profiles(before: Sequence[GraphRecord],
                   after: Sequence[GraphRecord]) -> list[tuple[GraphPair, list[NodePair]]]:
    """Every graph pair of ``match_graphs`` with its node pairs; an unpaired graph's nodes are all unpaired."""
    out = []
    for gi, gj in match_graphs(before, after):
        if gi is not None and gj is not None:
            pairs = match_nodes(before[gi], after[gj])
        else:
            pairs = [(i, None, MatchKind.REMOVED) for i in range(len(before[gi].nodes) if gi is not None else 0)]
            pairs += [(None, j, MatchKind.ADDED) for j in range(len(after[gj].nodes) if gj is not None else 0)]
        out.append(((gi, gj), pairs))
    return out


@dataclass(frozen=True)
class ProfileMatch:
    """The node pairs of two whole profiles, as arrays in pair order (graph pair by graph pair).

    ``before``/``after`` are flat node indices (a node frame's index) or -1;
    ``kind`` indexes ``KINDS``; ``graph`` indexes ``graph_pairs``.
    """

    graph_pairs: tuple[GraphPair, ...]
    before: np.ndarray
    after: np.ndarray
    kind: np.ndarray
    graph: np.ndarray


def _offsets(frame: NodeFrame, graphs: int) -> np.ndarray:
    """Where each graph's nodes start in the frame (and where the last ends)."""
    if graphs == 1:
        return np.array([0, len(frame)])
    sizes = np.bincount(np.asarray(frame.column("graph_index"), dtype=np.int64), minlength=graphs)
    return np.concatenate(([0], np.cumsum(sizes)))


def match_frames(before: Sequence[GraphRecord], after: Sequence[GraphRecord], frame_a: NodeFrame,
                 frame_b: NodeFrame, columns: ColumnCodes | None = None) -> ProfileMatch:
    """``match_profiles`` on two profiles' node frames (their graphs and node columns), without a NodeRecord.

    ``columns``: the frames' ColumnCodes, when the caller shares them with other views of the same pair.
    """
    graph_pairs = match_graphs(before, after)
    columns = columns or ColumnCodes.of_frames(frame_a, frame_b)
    exact = columns.key(EXACT_KEY)
    gap_codes: list[tuple[np.ndarray, np.ndarray]] = []

    def gaps() -> list[tuple[np.ndarray, np.ndarray]]:
        if not gap_codes:
            gap_codes.extend(columns.key(key) for key in _GAP_KEYS)
        return gap_codes
    off_a, off_b = _offsets(frame_a, len(before)), _offsets(frame_b, len(after))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
    for g, (gi, gj) in enumerate(graph_pairs):
        if gi is not None and gj is not None:
            (a1, a2), (b1, b2) = off_a[gi:gi + 2].tolist(), off_b[gj:gj + 2].tolist()

            def graph_gaps(a1: int = a1, a2: int = a2, b1: int = b1,
                           b2: int = b2) -> list[tuple[np.ndarray, np.ndarray]]:
                return [(ka[a1:a2], kb[b1:b2]) for ka, kb in gaps()]

            ia, ib, kind = match_codes((exact[0][a1:a2], exact[1][b1:b2]), graph_gaps)
            parts.append((np.where(ia >= 0, ia + a1, -1), np.where(ib >= 0, ib + b1, -1), kind, g))
        else:
            chunks: _Chunks = []
            if gi is not None:
                _unpaired(int(off_a[gi]), int(off_a[gi + 1]), 0, 0, chunks)
            elif gj is not None:
                _unpaired(0, 0, int(off_b[gj]), int(off_b[gj + 1]), chunks)
            for ia, ib, k in chunks:
                parts.append((ia, ib, np.full(len(ia), k, dtype=np.int8), g))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return ProfileMatch(tuple(graph_pairs), empty, empty, np.zeros(0, dtype=np.int8), empty)
    return ProfileMatch(
        tuple(graph_pairs), np.concatenate([p[0] for p in parts]).astype(np.int64),
        np.concatenate([p[1] for p in parts]).astype(np.int64), np.concatenate([p[2] for p in parts]),
        np.concatenate([np.full(len(p[0]), p[3], dtype=np.int64) for p in parts]))
