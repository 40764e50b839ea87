"""Roofline bounds per node: which limit explains a node's measured time.

For a node with ``flops`` and ``bytes`` moved, the device's peaks give two
lower bounds on its time: ``flops / peak_flops_per_s`` (compute) and
``bytes / peak_bytes_per_s`` (memory). The larger is the node's roofline
time; the ratio of it to the measured time is the fraction of the
attainable rate the node reached.

Bound, per node:
- ``compute`` / ``memory``: the roofline time explains a fair share of the
  measured time (at least ``OVERHEAD_RATIO``), and the larger bound names it;
- ``overhead``: the node took far longer than FLOPs and bytes explain and is
  short (under ``OVERHEAD_MAX_S``): its time is dispatch, Python and launch
  cost, not arithmetic or traffic (fusion or torch.compile removes it);
- ``slow``: far longer than the roofline explains, and long: a kernel that
  underperforms (a slow path, a bad layout, threads starved);
- ``unknown``: no cost formula or no peaks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from graphprof.analysis.frame import node_frame
from graphprof.profile.model import NodeRecord, Profile

OVERHEAD_RATIO = 0.1
OVERHEAD_MAX_S = 50e-6


class Bound(str, enum.Enum):
    COMPUTE = "compute"
    MEMORY = "memory"
    OVERHEAD = "overhead"
    SLOW = "slow"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Peaks:
    """Device peaks: FLOP/s (per dtype where known) and memory bandwidth in bytes/s."""

    flops_per_s: float
    bytes_per_s: float
    flops_per_s_by_dtype: Mapping[str, float] | None = None

    def flops_for(self, dtype: str | None) -> float:
        if dtype and self.flops_per_s_by_dtype and dtype in self.flops_per_s_by_dtype:
            return self.flops_per_s_by_dtype[dtype]
        return self.flops_per_s

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the memory roof meets the compute roof."""
        return self.flops_per_s / self.bytes_per_s


@dataclass(frozen=True)
class RooflinePoint:
    """One node on the roofline."""

    graph_id: int
    node_id: int
    time_s: float
    flops: int | None
    bytes_moved: int | None
    intensity: float | None
    achieved_flops_per_s: float | None
    attainable_flops_per_s: float | None
    roofline_time_s: float | None
    fraction_of_attainable: float | None
    bound: Bound


def peaks_from_meta(profile: Profile) -> Peaks | None:
    """The peaks stored in a profile's meta (by ``graphprof calibrate`` or by hand)."""
    peaks = profile.meta.peaks
    flops, bw = peaks.get("flops_per_s"), peaks.get("bytes_per_s")
    if not flops or not bw:
        return None
    by_dtype = {k.removeprefix("flops_per_s_"): float(v) for k, v in peaks.items()
                if k.startswith("flops_per_s_") and v}
    return Peaks(float(flops), float(bw), by_dtype or None)


def classify(node: NodeRecord, time_s: float, peaks: Peaks | None, graph_id: int = 0) -> RooflinePoint:
    """Roofline figures and bound of one node at a given measured time."""
    moved = None if node.bytes_read is None or node.bytes_written is None else node.bytes_read + node.bytes_written
    if node.flops is None or moved is None or peaks is None:
        return RooflinePoint(graph_id, node.id, time_s, node.flops, moved, None, None, None, None, None, Bound.UNKNOWN)
    dtype = node.in_dtypes[0] if node.in_dtypes else None
    peak_flops = peaks.flops_for(dtype)
    intensity = node.flops / moved if moved else None
    compute_s = node.flops / peak_flops
    memory_s = moved / peaks.bytes_per_s
    roof_s = max(compute_s, memory_s)
    attainable = min(peak_flops, intensity * peaks.bytes_per_s) if intensity is not None else peak_flops
    achieved = node.flops / time_s if time_s > 0 else None
    fraction = roof_s / time_s if time_s > 0 else None
    if roof_s == 0 or (fraction is not None and fraction < OVERHEAD_RATIO):
        bound = Bound.OVERHEAD if time_s < OVERHEAD_MAX_S else Bound.SLOW
    else:
        bound = Bound.COMPUTE if compute_s >= memory_s else Bound.MEMORY
    return RooflinePoint(graph_id, node.id, time_s, node.flops, moved, intensity, achieved, attainable,
                         roof_s, fraction, bound)


def roofline(profile: Profile, peaks: Peaks | None = None, stat: str = "median") -> list[RooflinePoint]:
    """A RooflinePoint for every node of every graph (views and free ops included)."""
    peaks = peaks or peaks_from_meta(profile)
    frame = node_frame(profile)
    # On an accelerator the device time is the op's time; host time is only its dispatch.
    times = frame.times(stat, "auto")
    return [classify(node, t, peaks, graph.id) for (graph, node), t in zip(frame.pairs, times)]
