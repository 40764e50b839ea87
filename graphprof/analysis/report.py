"""The bottleneck report: everything ``graphprof report`` shows, as data.

It gathers the other analyses into one result (summary and step statistics,
roofline of the top nodes and the time share of each bound, the critical
path of every graph, breakdowns by phase, module, op type and source line,
and the advisor's findings); ``render.report_text`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np

from graphprof.analysis.advisor import Finding, advise
from graphprof.analysis.critical_path import CriticalPath, critical_paths
from graphprof.analysis.eager import EagerOverhead, eager_overhead
from graphprof.analysis.frame import NodeFrame, node_frame
from graphprof.analysis.node_arrays import times_array
from graphprof.analysis.roofline import Bound, Peaks, RooflinePoint, peaks_from_meta, roofline_bounds
from graphprof.analysis.steps import StepStats, step_stats
from graphprof.analysis.table import TableResult, build_table
from graphprof.analysis.utilisation import UtilisationReport, utilisation
from graphprof.profile.merge import is_merged
from graphprof.profile.model import GraphRecord, NodeRecord, Profile
from graphprof.profile.node_columns import gc_paused
from graphprof.profile.step_facts import Workload

if TYPE_CHECKING:  # the rank comparison is imported for a merged profile only (a tenth of the imports)
    from graphprof.analysis.distributed import DistributedAnalysis

BREAKDOWNS = ("phase", "module", "type", "source")


@dataclass(frozen=True)
class RooflineRow:
    """A top node with its roofline figures."""

    graph: GraphRecord
    node: NodeRecord
    point: RooflinePoint
    #: The node's host (dispatch) time when ``point.time_s`` is its device time, else None.
    host_time_s: float | None = None


@dataclass(frozen=True)
class HostDeviceTimes:
    """Host dispatch beside device execution, for a profile with device times.

    Per step (sums over the ``nodes`` nodes that have device times, of each
    node's statistic): ``host_s`` is the time the host spent dispatching
    them, ``device_s`` the time the device spent on them.
    """

    host_s: float
    device_s: float
    nodes: int


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
    #: The rank comparison, for a profile merged from several ranks (``graphprof merge``).
    distributed: DistributedAnalysis | None = None
    #: Host vs device time, when the profile has device times (an accelerator run).
    host_device: HostDeviceTimes | None = None
    #: MFU/HFU per step and phase, and throughput (None without model FLOPs or steps).
    utilisation: UtilisationReport | None = None
    #: Warm eager calls against the replayed graph (None without recorded eager calls).
    eager: EagerOverhead | None = None


def build_report(profile: Profile, peaks: Peaks | None = None, stat: str = "median", top: int = 10,
                 module_depth: int = 2, peak_flops_per_s: float | None = None,
                 workload: Workload | None = None) -> Report:
    """Analyse ``profile`` for the report; ``peaks`` default to those in its meta.

    MFU/HFU are given against the profile's peak and against the user's:
    ``peak_flops_per_s``, else the FLOP peak of ``peaks`` when given.
    ``workload`` overrides the tokens/samples per step recorded in the profile.
    """
    # The analyses allocate millions of short-lived objects and no cycles; without a pause every
    # full collection walks the whole loaded profile again (a second of a 100,000-node report).
    with gc_paused():
        return _build_report(profile, peaks, stat, top, module_depth, peak_flops_per_s, workload)


def _build_report(profile: Profile, peaks: Peaks | None, stat: str, top: int, module_depth: int,
                  peak_flops_per_s: float | None, workload: Workload | None) -> Report:
    given_flops = peak_flops_per_s if peak_flops_per_s is not None else (peaks.flops_per_s if peaks else None)
    peaks = peaks or peaks_from_meta(profile)
    bounds = roofline_bounds(profile, peaks, stat)  # per node: device time where recorded, else host time
    frame = node_frame(profile)
    ranked = top_indices(times_array(frame, stat, "auto"), top)
    host_device = _host_device(profile, stat)
    host_times = frame.times(stat, "host") if host_device is not None else None
    graph_index = frame.column("graph_index")
    rows = tuple(RooflineRow(profile.graphs[graph_index[i]], node_at(frame, i), bounds.point(i),
                             host_times[i] if host_times is not None else None)
                 for i in ranked[:top])
    breakdowns = {
        key: build_table(profile, aggregate_by=key, top=top, stat=stat,
                         module_depth=module_depth if key == "module" else None)
        for key in BREAKDOWNS
    }
    return Report(
        profile=profile, stat=stat, peaks=peaks, steps=step_stats(profile),
        overview=build_table(profile, top=top, stat=stat), roofline_rows=rows,
        time_by_bound_s=bounds.time_by_bound(), critical=critical_paths(profile, stat=stat) if profile.graphs else (),
        breakdowns=breakdowns, findings=tuple(advise(profile, peaks, stat, bounds=bounds)),
        distributed=_distributed(profile, stat, top), host_device=host_device,
        utilisation=utilisation(profile, given_flops, stat, workload), eager=eager_overhead(profile, stat),
    )


def _distributed(profile: Profile, stat: str, top: int) -> DistributedAnalysis | None:
    """``analyze_distributed``: the rank comparison of a merged profile, None for one rank."""
    if not is_merged(profile):
        return None
    from graphprof.analysis.distributed import analyze_distributed

    return analyze_distributed(profile, stat=stat, top=top)


def top_indices(values: np.ndarray, top: int) -> list[int]:
    """The indices of the ``top`` largest values, largest first, the earlier of equal values first:
    ``sorted(range(n), key=values.__getitem__, reverse=True)[:top]``, without sorting every value."""
    n = len(values)
    if top <= 0:  # as the slice [:top] of the whole order
        return np.argsort(-values, kind="stable")[:top].tolist()
    if top < n:
        threshold = np.partition(values, n - top)[n - top]  # the top-th largest value
        candidates = np.flatnonzero(values >= threshold)  # ties with it included, in index order
    else:
        candidates = np.arange(n)
    ordered = candidates[np.argsort(-values[candidates], kind="stable")]
    return ordered[:top].tolist()


def node_at(frame: NodeFrame, i: int) -> NodeRecord:
    """The record of node ``i`` of ``frame``, made from its columns (a report shows a few nodes, not all)."""
    return frame.pair(i)[1]


def _host_device(profile: Profile, stat: str) -> HostDeviceTimes | None:
    frame = node_frame(profile)
    timed = np.flatnonzero(frame.sampled("device_time_ns")).tolist()
    if not timed:
        return None
    host, device = frame.times(stat, "host"), frame.times(stat, "device")
    return HostDeviceTimes(host_s=sum([host[i] for i in timed]), device_s=sum([device[i] for i in timed]),
                           nodes=len(timed))
