"""The bottleneck report: everything ``graphprof report`` shows, as data.

It gathers the other analyses into one result (summary and step statistics,
roofline of the top nodes and the time share of each bound, the critical
path of every graph, breakdowns by phase, module, op type and source line,
and the advisor's findings); ``render.report_text`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from graphprof.analysis.advisor import Finding, advise
from graphprof.analysis.critical_path import CriticalPath, critical_paths
from graphprof.analysis.roofline import Bound, Peaks, RooflinePoint, peaks_from_meta, roofline
from graphprof.analysis.steps import StepStats, step_stats
from graphprof.analysis.table import TableResult, build_table
from graphprof.profile.model import GraphRecord, NodeRecord, Profile

BREAKDOWNS = ("phase", "module", "type", "source")


@dataclass(frozen=True)
class RooflineRow:
    """A top node with its roofline figures."""

    graph: GraphRecord
    node: NodeRecord
    point: RooflinePoint


@dataclass(frozen=True)
class Report:
    """The bottleneck report of one profile."""

    profile: Profile
    stat: str
    peaks: Peaks | None
    steps: StepStats
    overview: TableResult
    roofline_rows: tuple[RooflineRow, ...]
    time_by_bound_s: Mapping[Bound, float]
    critical: tuple[CriticalPath, ...]
    breakdowns: Mapping[str, TableResult]
    findings: tuple[Finding, ...]


def build_report(profile: Profile, peaks: Peaks | None = None, stat: str = "median", top: int = 10,
                 module_depth: int = 2) -> Report:
    """Analyse ``profile`` for the report; ``peaks`` default to those in its meta."""
    peaks = peaks or peaks_from_meta(profile)
    points = roofline(profile, peaks, stat)
    by_key = {(p.graph_id, p.node_id): p for p in points}
    time_by_bound: dict[Bound, float] = {}
    for p in points:
        time_by_bound[p.bound] = time_by_bound.get(p.bound, 0.0) + p.time_s
    ranked = sorted(profile.iter_nodes(), key=lambda gn: by_key[(gn[0].id, gn[1].id)].time_s, reverse=True)
    rows = tuple(RooflineRow(g, n, by_key[(g.id, n.id)]) for g, n in ranked[:top])
    breakdowns = {
        key: build_table(profile, aggregate_by=key, top=top, stat=stat,
                         module_depth=module_depth if key == "module" else None)
        for key in BREAKDOWNS
    }
    return Report(
        profile=profile, stat=stat, peaks=peaks, steps=step_stats(profile),
        overview=build_table(profile, top=top, stat=stat), roofline_rows=rows,
        time_by_bound_s=time_by_bound, critical=critical_paths(profile, stat=stat) if profile.graphs else (),
        breakdowns=breakdowns, findings=tuple(advise(profile, peaks, stat, points)),
    )
