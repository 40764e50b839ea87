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

Graphs pair by ``(name, kind)`` in order of appearance (a whole-step graph
``step``, segments, the ``host`` graph of segmented capture), then leftover
graphs of the same kind pair in order of id. A graph with no partner has
all its nodes removed or added.
"""

from __future__ import annotations

import enum
from difflib import SequenceMatcher
from typing import Callable, Hashable, Sequence

from graphprof.profile.model import GraphRecord, NodeRecord


class MatchKind(str, enum.Enum):
    """How a node of one profile relates to the other profile."""

    MATCHED = "matched"    # same op, module, phase and input shapes
    MODIFIED = "modified"  # paired by a loose pass: module path, shapes or overload differ
    ADDED = "added"        # only in the second (after) profile
    REMOVED = "removed"    # only in the first (before) profile


#: (index in the before graph or None, index in the after graph or None, kind), in execution order.
NodePair = tuple["int | None", "int | None", MatchKind]
#: (index into the before profile's graphs or None, index into the after profile's graphs or None).
GraphPair = tuple["int | None", "int | None"]


def exact_key(node: NodeRecord) -> Hashable:
    """What must be equal for two nodes to be the same node of a program."""
    return node.op, node.module, node.phase, node.in_shapes


def loose_key(node: NodeRecord) -> Hashable:
    """What must be equal for two nodes to be the same op of a program whose shapes changed."""
    return node.type, node.module, node.phase


def _interned(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """Keys as small ints: SequenceMatcher hashes and compares them many times."""
    table: dict[Hashable, int] = {}
    ia = [table.setdefault(k, len(table)) for k in a]
    ib = [table.setdefault(k, len(table)) for k in b]
    return ia, ib


def _align(a: Sequence[int], b: Sequence[int]) -> list[tuple[str, int, int, int, int]]:
    """SequenceMatcher's opcodes over ``a`` and ``b``, with a common prefix and suffix taken off first.

    Trimming makes the usual case (two runs of the same program, a local
    change) linear and spares SequenceMatcher most of the sequence.
    """
    n, m = len(a), len(b)
    lo = 0
    while lo < n and lo < m and a[lo] == b[lo]:
        lo += 1
    hi_a, hi_b = n, m
    while hi_a > lo and hi_b > lo and a[hi_a - 1] == b[hi_b - 1]:
        hi_a -= 1
        hi_b -= 1
    ops: list[tuple[str, int, int, int, int]] = []
    if lo:
        ops.append(("equal", 0, lo, 0, lo))
    if hi_a > lo or hi_b > lo:
        matcher = SequenceMatcher(None, a[lo:hi_a], b[lo:hi_b], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            ops.append((tag, i1 + lo, i2 + lo, j1 + lo, j2 + lo))
    if hi_a < n:
        ops.append(("equal", hi_a, n, hi_b, m))
    return ops


def shape_key(node: NodeRecord) -> Hashable:
    """The same op on the same shapes whose module path changed (a layer inserted before it renumbers it)."""
    return node.op, node.phase, node.in_shapes


#: The gap passes after the exact alignment, in order (see the module docstring), and the kind of pair each finds.
_GAP_PASSES: tuple[tuple[Callable[[NodeRecord], Hashable], MatchKind], ...] = (
    (shape_key, MatchKind.MODIFIED), (loose_key, MatchKind.MODIFIED),
)


def unpaired(removed: Sequence[int], added: Sequence[int]) -> list[NodePair]:
    """Nodes without a partner: the before ones removed, then the after ones added."""
    return [(i, None, MatchKind.REMOVED) for i in removed] + [(None, j, MatchKind.ADDED) for j in added]


def _gap_pairs(before: Sequence[NodeRecord], after: Sequence[NodeRecord],
               i1: int, i2: int, j1: int, j2: int, level: int = 0) -> list[NodePair]:
    """Pairs of one unaligned gap: aligned on the next pass's key, smaller gaps recursively, the rest unpaired."""
    if level == len(_GAP_PASSES) or i1 == i2 or j1 == j2:
        return unpaired(range(i1, i2), range(j1, j2))
    key, kind = _GAP_PASSES[level]
    ka, kb = _interned([key(n) for n in before[i1:i2]], [key(n) for n in after[j1:j2]])
    pairs: list[NodePair] = []
    for tag, a1, a2, b1, b2 in _align(ka, kb):
        if tag == "equal":
            pairs.extend((i1 + x, j1 + y, kind) for x, y in zip(range(a1, a2), range(b1, b2)))
        else:
            pairs.extend(_gap_pairs(before, after, i1 + a1, i1 + a2, j1 + b1, j1 + b2, level + 1))
    return pairs


def match_nodes(before: GraphRecord, after: GraphRecord) -> list[NodePair]:
    """Every node of both graphs, paired by the rule of this module's docstring, in execution order."""
    a, b = before.nodes, after.nodes
    # exact_key, inlined: this runs over every node of both profiles.
    ka, kb = _interned([(n.op, n.module, n.phase, n.in_shapes) for n in a],
                       [(n.op, n.module, n.phase, n.in_shapes) for n in b])
    if ka == kb:
        return [(i, i, MatchKind.MATCHED) for i in range(len(a))]
    pairs: list[NodePair] = []
    for tag, i1, i2, j1, j2 in _align(ka, kb):
        if tag == "equal":
            pairs.extend((i, j, MatchKind.MATCHED) for i, j in zip(range(i1, i2), range(j1, j2)))
        else:
            pairs.extend(_gap_pairs(a, b, i1, i2, j1, j2))
    return pairs


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
            pairs = unpaired(range(len(before[gi].nodes)) if gi is not None else (),
                             range(len(after[gj].nodes)) if gj is not None else ())
        out.append(((gi, gj), pairs))
    return out
