"""The summary above a profile table: totals of the whole profile, filters ignored.

As in MegEngine's profile_analyze, the summary and the table's percentages
refer to every node of the profile, so a filtered table shows what share of
the whole step the selected nodes take (its cumulative % stops short of 100).

"Total time" is the sum over nodes of each node's time under the chosen
statistic (median by default), i.e. the serial time of one step's ops.
Achieved FLOP/s divides the FLOPs that are known by the total time, so it is a
lower bound when some ops have no FLOP formula; ``flops_time_share`` says how
much of the time those FLOPs cover.
"""

from __future__ import annotations

import math
from itertools import compress
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphprof.analysis.entries import ratio
from graphprof.analysis.frame import NodeFrame
from graphprof.analysis.node_arrays import column_codes
from graphprof.analysis.stats import stat_fn
from graphprof.profile.model import Phase, Profile


@dataclass(frozen=True)
class PhaseTime:
    """Time of one phase of the step (forward, backward, optimizer, other)."""

    phase: str
    nodes: int
    time_s: float
    percent: float


@dataclass(frozen=True)
class Summary:
    """Whole-profile figures, in SI units; None where the profile has no data for one."""

    function: str
    device_type: str
    device_name: str
    stat: str
    clock: str
    steps: int
    graphs: int
    nodes: int
    total_time_s: float
    step_wall_time_s: float | None
    total_flops: int | None
    flops_nodes: int
    flops_time_share: float
    achieved_flop_per_s: float | None
    total_bytes_moved: int | None
    achieved_bandwidth_bytes_per_s: float | None
    phases: tuple[PhaseTime, ...]
    peak_live_bytes: int | None
    peak_live_node: str | None


def summarize(profile: Profile, frame: NodeFrame, times: Sequence[float], stat: str, clock: str) -> Summary:
    """The summary of ``profile``; ``frame`` is its node frame and ``times`` the nodes' times (in frame order).

    Reads the frame's columns, never a NodeRecord, so that summarising a loaded profile builds none.
    """
    total = math.fsum(times)
    flops_column = frame.column("flops")
    counted = [f is not None for f in flops_column]
    flops_values = list(compress(flops_column, counted))
    flops, flops_nodes = sum(flops_values), len(flops_values)
    flops_times = list(compress(times, counted))
    moved_values = [v for v in frame.column("bytes_moved") if v is not None]
    moved_known = bool(moved_values)
    moved = sum(moved_values)
    # each phase's times, from the phase codes (a file's index column): one array mask per phase
    phase_codes, phase_values = column_codes(frame, "phase")
    time_array = np.asarray(times, dtype=np.float64)
    phase_times = {phase: time_array[phase_codes == code].tolist() for code, phase in enumerate(phase_values)}
    live_column = frame.column("live_bytes")
    known_live = [v for v in live_column if v is not None]
    peak: int | None = max(known_live) if known_live else None
    peak_index: int | None = live_column.index(peak) if peak is not None else None  # the first node at the peak
    phases = []
    for member in Phase:
        if member.value in phase_times:
            t = math.fsum(phase_times[member.value])
            phases.append(PhaseTime(member.value, len(phase_times[member.value]), t,
                                    100.0 * t / total if total > 0 else 0.0))
    walls = [s.wall_time_s for s in profile.steps]
    total_flops = flops if flops_nodes else None
    total_moved = moved if moved_known else None
    # The memory pass's high-water mark (live bytes while an op runs) wins over
    # the largest live-after figure, so that every view names the same peak.
    recorded = [(gi, mp) for gi, g in enumerate(profile.graphs) if (mp := getattr(g, "memory_peak", None)) is not None]
    if recorded:
        gi, mp = max(recorded, key=lambda item: item[1].live_bytes)
        start = sum(frame.sizes[:gi])
        ids = frame.column("id")[start:start + frame.sizes[gi]]
        if mp.node_id in ids:
            peak, peak_index = mp.live_bytes, start + ids.index(mp.node_id)
    peak_node = None
    if peak_index is not None:
        name, node_id = frame.column("name")[peak_index], frame.column("id")[peak_index]
        graph_name = frame.column("graph")[peak_index]
        peak_node = f"{name} (#{node_id}" + (f" in {graph_name})" if len(profile.graphs) > 1 else ")")
    return Summary(
        function=profile.meta.function, device_type=profile.meta.device_type,
        device_name=profile.meta.device_name, stat=stat, clock=clock, steps=len(profile.steps),
        graphs=len(profile.graphs), nodes=len(times), total_time_s=total,
        step_wall_time_s=stat_fn(stat)(walls) if walls else None,
        total_flops=total_flops, flops_nodes=flops_nodes,
        flops_time_share=math.fsum(flops_times) / total if total > 0 else 0.0,
        achieved_flop_per_s=ratio(total_flops, total),
        total_bytes_moved=total_moved, achieved_bandwidth_bytes_per_s=ratio(total_moved, total),
        phases=tuple(phases), peak_live_bytes=peak, peak_live_node=peak_node,
    )
