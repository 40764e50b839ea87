"""How much of a profile the cost model covers.

A node is covered when it has a FLOP count (``flops is not None``): views
and other deliberately free ops count as covered with 0 FLOPs, ops without
a formula do not. Coverage is given as a share of op nodes and as a share of
op time (each node's time under a statistic over the profiled steps), with
the ops that have no formula, slowest first, so the gap can be closed with
``graphprof.register_cost``.

graphprof also records host-side time that is not a graph op: gaps between
segments (``host.gap``), gradient bookkeeping around a replay
(``host.zero_grad``, ``host.assign_grad``) and host reads of tensors
(``Tensor.<method>``). Coverage is about ops, so it leaves all of them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import NodeRecord, Profile


#: Op namespaces of host-time records (runtime/collect.py, runtime/segment_records.py).
HOST_OP_PREFIXES = ("host.", "Tensor.")


def is_host_time(node: NodeRecord) -> bool:
    """True for records of host-side time (gaps, gradient bookkeeping, host reads), not graph ops."""
    return node.op.startswith(HOST_OP_PREFIXES)


@dataclass(frozen=True)
class UncoveredOp:
    """An op without a cost formula: how many nodes run it and their time."""

    op: str
    nodes: int
    time_s: float


@dataclass(frozen=True)
class CostCoverage:
    """Share of op nodes and op time whose FLOPs are known."""

    nodes: int
    covered_nodes: int
    time_s: float
    covered_time_s: float
    uncovered: tuple[UncoveredOp, ...]
    stat: str = "median"

    @property
    def node_share(self) -> float:
        """Covered nodes / nodes (1.0 for a profile without nodes: nothing is missing)."""
        return self.covered_nodes / self.nodes if self.nodes else 1.0

    @property
    def time_share(self) -> float:
        """Covered time / op time (falls back to the node share when no time was recorded)."""
        return self.covered_time_s / self.time_s if self.time_s > 0 else self.node_share

    @property
    def uncovered_ops(self) -> tuple[str, ...]:
        return tuple(u.op for u in self.uncovered)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, for callers that save or print the coverage."""
        return {
            "node_share": self.node_share,
            "time_share": self.time_share,
            "nodes": self.nodes,
            "covered_nodes": self.covered_nodes,
            "time_s": self.time_s,
            "covered_time_s": self.covered_time_s,
            "stat": self.stat,
            "ops_without_formula": [
                {"op": u.op, "nodes": u.nodes, "time_s": u.time_s} for u in self.uncovered
            ],
        }


def node_coverage(nodes: Iterable[NodeRecord], stat: str = "median") -> CostCoverage:
    """Coverage of a set of op nodes (host-time records are skipped), their time under ``stat``."""
    fn = stat_fn(stat)
    total = covered = 0
    time_s = covered_time_s = 0.0
    missing: dict[str, list[float]] = {}
    for node in nodes:
        if is_host_time(node):
            continue
        t = fn(node.host_time_s)
        total += 1
        time_s += t
        if node.flops is not None:
            covered += 1
            covered_time_s += t
        else:
            missing.setdefault(node.op, []).append(t)
    uncovered = sorted(
        (UncoveredOp(op=op, nodes=len(ts), time_s=sum(ts)) for op, ts in missing.items()),
        key=lambda u: (-u.time_s, -u.nodes, u.op),
    )
    return CostCoverage(nodes=total, covered_nodes=covered, time_s=time_s, covered_time_s=covered_time_s,
                        uncovered=tuple(uncovered), stat=stat)


def cost_coverage(profile: Profile, stat: str = "median") -> CostCoverage:
    """Coverage of every op node of every graph of ``profile``."""
    return node_coverage((node for _, node in profile.iter_nodes()), stat=stat)
