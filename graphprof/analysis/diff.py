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
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from graphprof.analysis.diff_groups import GroupDiff, GroupDiffs, aggregate_diff, group_key_fn, order_items
from graphprof.analysis.diff_nodes import NodeDiff, NodeDiffs, order_nodes, pair_nodes
from graphprof.analysis.diff_rows import ORDER_KEYS, DiffOrder, flops_delta, parse_diff_order
from graphprof.analysis.filters import resolve_clock, select, why_empty
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.match import ColumnCodes
from graphprof.analysis.options import TableOptions, make_options
from graphprof.analysis.regression import RegressionGate, StepComparison, compare_steps, regression_gate
from graphprof.profile.model import Profile

__all__ = ["DEFAULT_AGGREGATES", "ORDER_KEYS", "DiffOrder", "DiffResult", "GroupDiff", "GroupDiffs", "NodeDiff",
           "NodeDiffs", "SideSummary", "aggregate_diff", "diff", "group_key_fn", "order_items", "order_nodes",
           "parse_diff_order"]

#: Groupings of the aggregate tables every diff carries (``--aggregate-by`` may add another).
DEFAULT_AGGREGATES = ("type", "module", "phase")



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
        return flops_delta(self.before.total_flops, self.after.total_flops)


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
    columns = ColumnCodes.of_frames(*frames)  # shared by the matching and the groupings
    pairs, counts, names, shared = pair_nodes(a, b, frames, columns, ta, tb, keep_a, keep_b)
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
