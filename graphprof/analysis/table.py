"""Per-node table of a profile, in the spirit of ``profile_analyze``.

Produces plain rows (numbers in SI units); renderers decide how they look.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import Profile


@dataclass(frozen=True)
class NodeRow:
    """One node of the table, its time under the chosen statistic."""

    graph: str
    id: int
    name: str
    op: str
    type: str
    module: str
    module_type: str
    source: str
    phase: str
    scope: str
    in_shapes: tuple[tuple[int, ...] | None, ...]
    out_shapes: tuple[tuple[int, ...] | None, ...]
    time_s: float
    percent: float
    cumulative_percent: float


@dataclass(frozen=True)
class NodeTable:
    """Rows sorted by time (descending) and the total they are a share of."""

    rows: tuple[NodeRow, ...]
    total_time_s: float
    stat: str
    steps: int


def node_table(profile: Profile, top: int = 10, stat: str = "median") -> NodeTable:
    """The ``top`` slowest nodes (0 = all) under ``stat`` across profiled steps."""
    fn = stat_fn(stat)
    timed = [(g, n, fn(n.host_time_s)) for g, n in profile.iter_nodes()]
    total = sum(t for _, _, t in timed)
    timed.sort(key=lambda item: item[2], reverse=True)
    if top > 0:
        timed = timed[:top]
    rows = []
    cumulative = 0.0
    for graph, node, t in timed:
        cumulative += t
        rows.append(NodeRow(
            graph=graph.name, id=node.id, name=node.name, op=node.op, type=node.type,
            module=node.module, module_type=node.module_type, source=node.source,
            phase=node.phase.value, scope=node.scope, in_shapes=node.in_shapes,
            out_shapes=node.out_shapes, time_s=t,
            percent=100.0 * t / total if total > 0 else 0.0,
            cumulative_percent=100.0 * cumulative / total if total > 0 else 0.0,
        ))
    return NodeTable(rows=tuple(rows), total_time_s=total, stat=stat, steps=len(profile.steps))
