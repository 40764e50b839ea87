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

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from graphprof.analysis.aggregate import truncate_module
from graphprof.analysis.entries import ratio
from graphprof.analysis.filters import NodePairs, flat_nodes, resolve_clock, select, why_empty
from graphprof.analysis.frame import node_frame
from graphprof.analysis.match import MatchKind, match_profiles
from graphprof.analysis.options import TableOptionError, TableOptions, make_options
from graphprof.analysis.regression import RegressionGate, StepComparison, compare_steps, regression_gate
from graphprof.profile.model import GraphRecord, NodeRecord, Phase, Profile

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

    Times are the chosen statistic over each profile's steps (None on the
    side where the node does not exist); ``delta_time_s`` counts a missing
    side as 0, so an added node's delta is its whole time. ``ratio`` is
    after / before time (None unless both are known and before > 0).
    """

    status: MatchKind
    graph: str
    before: NodeRecord | None
    after: NodeRecord | None
    before_time_s: float | None
    after_time_s: float | None
    delta_time_s: float
    ratio: float | None
    delta_flops: float | None
    position: int

    @property
    def node(self) -> NodeRecord:
        """The after node, or the before node of a removed one (for descriptive fields)."""
        return self.after if self.after is not None else self.before  # type: ignore[return-value]

    @property
    def changed(self) -> bool:
        """Not an identical node: unmatched, or time or FLOPs differ at all."""
        if self.status is not MatchKind.MATCHED or self.delta_time_s != 0:
            return True
        return (self.before.flops if self.before else None) != (self.after.flops if self.after else None)


_NODE_DIFF_FIELDS = tuple(f.name for f in fields(NodeDiff))
_new = object.__new__


def _node_diff(status: MatchKind, graph: str, a: NodeRecord | None, b: NodeRecord | None,
               ta: float | None, tb: float | None, position: int) -> NodeDiff:
    """A NodeDiff built without the frozen dataclass's __init__ (one object.__setattr__ per field):
    a diff of two 100,000-node profiles builds 100,000 of them. It has no __post_init__ to skip."""
    fa = a.flops if a is not None else 0
    fb = b.flops if b is not None else 0
    out = _new(NodeDiff)
    out.__dict__.update(zip(_NODE_DIFF_FIELDS, (
        status, graph, a, b, ta, tb, (tb or 0.0) - (ta or 0.0), ratio(tb, ta),
        None if fa is None or fb is None else fb - fa, position)))
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
    nodes: tuple[NodeDiff, ...]
    aggregates: Mapping[str, tuple[GroupDiff, ...]]
    gate: RegressionGate | None = None
    note: str | None = None

    @property
    def changed(self) -> tuple[NodeDiff, ...]:
        """The node pairs (after filters) that are not identical."""
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


def _side(profile: Profile, times: Sequence[float]) -> SideSummary:
    known = [n.flops for _, n in profile.iter_nodes() if n.flops is not None]
    meta = profile.meta
    return SideSummary(meta.function, meta.device_type + (f" ({meta.device_name})" if meta.device_name else ""),
                       len(profile.graphs), len(times), len(profile.steps), math.fsum(times),
                       sum(known) if known else None)


def _offsets(profile: Profile) -> list[int]:
    out, total = [], 0
    for g in profile.graphs:
        out.append(total)
        total += len(g.nodes)
    return out


def _is_host(graph: GraphRecord) -> bool:
    """The graph of host time around the captured graphs (zero_grad, gaps between segments)."""
    return graph.kind.value == "host" or graph.name == "host"


def _pair_nodes(before: Profile, after: Profile, ta: list[float], tb: list[float], keep_a: set[int],
                keep_b: set[int]) -> tuple[list[NodeDiff], dict[str, int], list[tuple[str | None, str | None]], bool]:
    """Node diffs of the kept nodes, counts per status (all nodes), graph names paired, and whether any
    node of a captured graph (not the host graph) found a partner."""
    off_a, off_b = _offsets(before), _offsets(after)
    out: list[NodeDiff] = []
    counts = {k.value: 0 for k in MatchKind}
    names: list[tuple[str | None, str | None]] = []
    shared = False
    for (gi, gj), pairs in match_profiles(before.graphs, after.graphs):
        nodes_a = before.graphs[gi].nodes if gi is not None else ()
        nodes_b = after.graphs[gj].nodes if gj is not None else ()
        names.append((before.graphs[gi].name if gi is not None else None,
                      after.graphs[gj].name if gj is not None else None))
        graph = names[-1][1] or names[-1][0] or ""
        if gi is not None and gj is not None and not _is_host(before.graphs[gi]):
            shared = shared or any(i is not None and j is not None for i, j, _ in pairs)
        for i, j, kind in pairs:
            counts[kind.value] += 1
            fa = None if i is None else off_a[gi] + i  # type: ignore[index]
            fb = None if j is None else off_b[gj] + j  # type: ignore[index]
            if (fa is not None and fa in keep_a) or (fb is not None and fb in keep_b):
                out.append(_node_diff(kind, graph, None if i is None else nodes_a[i], None if j is None else nodes_b[j],
                                      None if fa is None else ta[fa], None if fb is None else tb[fb], len(out)))
    return out, counts, names, shared


def _shape_label(node: NodeRecord) -> str:
    return f"{node.type} {[list(s) if s is not None else None for s in node.in_shapes]}"


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


def _group_keys(by: str, module_depth: int | None, pairs: NodePairs) -> Sequence[str]:
    """``group_key_fn(by, module_depth)`` of every node of ``pairs``, computed once per distinct value.

    Why: a diff groups two 100,000-node profiles six ways; a function call per
    node and grouping was most of its time.
    """
    if by == "all":
        return ["all"] * len(pairs)
    if by in ("type", "module", "source", "scope", "phase") and not (by == "module" and module_depth):
        if by == "phase":
            values = {p: p.value for p in Phase}  # Enum.value is a property: slow over every node
            return [values[n.phase] for _, n in pairs]
        return [getattr(n, by) for _, n in pairs]
    if by == "graph":
        return [g.name for g, _ in pairs]
    key_of = group_key_fn(by, module_depth)
    if by == "shape":
        labels: dict[tuple[str, Any], str] = {}
        out = []
        for g, n in pairs:
            k = (n.type, n.in_shapes)
            label = labels.get(k)
            if label is None:
                label = labels[k] = key_of(g, n)
            out.append(label)
        return out
    if by == "module":
        paths: dict[str, str] = {}
        out = []
        for g, n in pairs:
            label = paths.get(n.module)
            if label is None:
                label = paths[n.module] = key_of(g, n)
            out.append(label)
        return out
    return [key_of(g, n) for g, n in pairs]


def _buckets(keys: Sequence[str], keep: Sequence[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in keep:
        key = keys[i]
        bucket = out.get(key)
        if bucket is None:
            out[key] = [i]
        else:
            bucket.append(i)
    return out


def aggregate_diff(by: str, pairs_a: NodePairs, pairs_b: NodePairs, ta: Sequence[float], tb: Sequence[float],
                   keep_a: Sequence[int], keep_b: Sequence[int], fn: str = "sum",
                   module_depth: int | None = None) -> list[GroupDiff]:
    """Groups of the kept nodes of each profile, outer-joined on the group key (first-seen order).

    A side without nodes in a group has 0 time and 0 FLOPs there, not unknown ones.
    """
    group_key_fn(by, module_depth)  # an unsupported grouping fails here, with its sentence
    ba = _buckets(_group_keys(by, module_depth, pairs_a), keep_a)
    bb = _buckets(_group_keys(by, module_depth, pairs_b), keep_b)
    column_a, column_b = [n.flops for _, n in pairs_a], [n.flops for _, n in pairs_b]

    fold = _FOLD[fn]

    def folded(bucket: list[int], pairs: NodePairs, times: Sequence[float]) -> tuple[float, float | None]:
        if not bucket:
            return 0.0, 0
        column = column_a if pairs is pairs_a else column_b
        flops = [f for f in map(column.__getitem__, bucket) if f is not None]  # unknown ones left out
        folded_flops = (sum(flops) if fn == "sum" else fold(flops)) if flops else None  # int sums stay exact
        return fold([times[i] for i in bucket]), folded_flops

    out = []
    for key in {**dict.fromkeys(ba), **dict.fromkeys(bb)}:
        ia, ib = ba.get(key, []), bb.get(key, [])
        (time_a, flops_a), (time_b, flops_b) = folded(ia, pairs_a, ta), folded(ib, pairs_b, tb)
        out.append(GroupDiff(by, key, len(ia), len(ib), time_a, time_b, flops_a, flops_b))
    return out


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
    value = getattr(item.node, key)
    return value.value if key == "phase" else value


def order_items(items: Sequence[Any], order: DiffOrder) -> list[Any]:
    """Items ordered by ``order``; unknown values last in either direction; ties keep their order."""
    values = [(_order_value(x, order.key), x) for x in items]
    known = [vx for vx in values if vx[0] is not None]
    known.sort(key=lambda vx: vx[0], reverse=not order.ascending)
    return [x for _, x in known] + [x for v, x in values if v is None]


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
    pairs_a, pairs_b = flat_nodes(a), flat_nodes(b)
    ta, tb = node_frame(a).times(options.stat, clock), node_frame(b).times(options.stat, clock)
    keep_a, keep_b = select(pairs_a, options, ta), select(pairs_b, options, tb)
    nodes, counts, names, shared = _pair_nodes(a, b, ta, tb, set(keep_a), set(keep_b))
    if not shared:
        nodes = []
    groupings = list(DEFAULT_AGGREGATES)
    if options.aggregated and (options.aggregate_by or "all") not in groupings:
        groupings.append(options.aggregate_by or "all")
    aggregates = {}
    for by in groupings:
        depth = options.module_depth if by == "module" else None
        groups = aggregate_diff(by, pairs_a, pairs_b, ta, tb, keep_a, keep_b, options.aggregate_fn, depth)
        aggregates[by] = tuple(order_items(groups, order))
    note = None
    if not keep_a and not keep_b and (pairs_a or pairs_b):
        note = why_empty(b if pairs_b else a, options)
    steps = compare_steps(a, b)
    return DiffResult(
        options=options, order=order, clock=clock, mode="nodes" if shared else "aggregate",
        before=_side(a, ta), after=_side(b, tb), steps=steps, graph_pairs=tuple(names), counts=counts,
        nodes=tuple(order_items(nodes, order)), aggregates=aggregates,
        gate=None if fail_if_slower is None else regression_gate(steps, fail_if_slower), note=note,
    )
