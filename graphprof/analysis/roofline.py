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
from typing import Mapping, Sequence

import numpy as np

from graphprof.analysis.frame import node_frame
from graphprof.analysis.node_arrays import column_codes, int_array, times_array
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


def _point(node_id: int, flops: int | None, bytes_read: int | None, bytes_written: int | None,
           in_dtypes: tuple[str | None, ...], time_s: float, peaks: Peaks | None, graph_id: int) -> RooflinePoint:
    moved = None if bytes_read is None or bytes_written is None else bytes_read + bytes_written
    if flops is None or moved is None or peaks is None:
        return RooflinePoint(graph_id, node_id, time_s, flops, moved, None, None, None, None, None, Bound.UNKNOWN)
    dtype = in_dtypes[0] if in_dtypes else None
    peak_flops = peaks.flops_for(dtype)
    intensity = flops / moved if moved else None
    compute_s = flops / peak_flops
    memory_s = moved / peaks.bytes_per_s
    roof_s = max(compute_s, memory_s)
    attainable = min(peak_flops, intensity * peaks.bytes_per_s) if intensity is not None else peak_flops
    achieved = flops / time_s if time_s > 0 else None
    fraction = roof_s / time_s if time_s > 0 else None
    if roof_s == 0 or (fraction is not None and fraction < OVERHEAD_RATIO):
        bound = Bound.OVERHEAD if time_s < OVERHEAD_MAX_S else Bound.SLOW
    else:
        bound = Bound.COMPUTE if compute_s >= memory_s else Bound.MEMORY
    return RooflinePoint(graph_id, node_id, time_s, flops, moved, intensity, achieved, attainable,
                         roof_s, fraction, bound)


def classify(node: NodeRecord, time_s: float, peaks: Peaks | None, graph_id: int = 0) -> RooflinePoint:
    """Roofline figures and bound of one node at a given measured time."""
    return _point(node.id, node.flops, node.bytes_read, node.bytes_written, node.in_dtypes, time_s, peaks, graph_id)


#: Bound of each code of ``RooflineBounds.codes``.
BOUNDS = tuple(Bound)
_CODE = {b: i for i, b in enumerate(BOUNDS)}


@dataclass(frozen=True)
class RooflineBounds:
    """Every node's bound and roofline time as arrays over the node frame (index = execution order).

    Why arrays: a report needs every node's bound (time by bound, the
    advisor's rules) but the full figures of ten; classifying 100,000 nodes
    one ``RooflinePoint`` at a time was a large part of it. ``point(i)``
    gives node ``i``'s ``RooflinePoint``, the same as ``classify``.
    """

    profile: Profile
    peaks: Peaks | None
    times: Sequence[float]
    #: Index into ``BOUNDS`` per node.
    codes: np.ndarray
    #: Roofline time per node, NaN where unknown.
    roofline_time_s: np.ndarray

    def bound(self, i: int) -> Bound:
        return BOUNDS[self.codes[i]]

    def point(self, i: int) -> RooflinePoint:
        frame = node_frame(self.profile)
        col = frame.column
        return _point(col("id")[i], col("flops")[i], col("bytes_read")[i], col("bytes_written")[i],
                      col("in_dtypes")[i], self.times[i], self.peaks, col("graph_id")[i])

    def time_by_bound(self) -> dict[Bound, float]:
        """Total time per bound, in order of each bound's first node, summed in node order."""
        sums = np.bincount(self.codes, weights=np.asarray(self.times, dtype=np.float64), minlength=len(BOUNDS))
        present = np.bincount(self.codes, minlength=len(BOUNDS)) > 0
        first = sorted((int(np.argmax(self.codes == c)), c) for c in range(len(BOUNDS)) if present[c])
        return {BOUNDS[c]: float(sums[c]) for _, c in first}

    @classmethod
    def of_points(cls, profile: Profile, peaks: Peaks | None, points: Sequence[RooflinePoint]) -> "RooflineBounds":
        """From ``roofline(profile, ...)``'s points (one per node of the frame, in its order)."""
        codes = np.fromiter((_CODE[p.bound] for p in points), dtype=np.int8, count=len(points))
        roof = np.fromiter((np.nan if p.roofline_time_s is None else p.roofline_time_s for p in points),
                           dtype=np.float64, count=len(points))
        return cls(profile, peaks, [p.time_s for p in points], codes, roof)


def roofline_bounds(profile: Profile, peaks: Peaks | None = None, stat: str = "median") -> RooflineBounds:
    """Every node's bound under ``stat`` (device time where recorded, else host time), as ``classify`` decides.

    The arithmetic is ``classify``'s, element by element (int to float64
    conversion and IEEE division round as Python's do), so each bound is the same.
    """
    peaks = peaks or peaks_from_meta(profile)
    frame = node_frame(profile)
    times = frame.times(stat, "auto")
    n = len(times)
    unknown = _CODE[Bound.UNKNOWN]
    if peaks is None or n == 0:
        return RooflineBounds(profile, peaks, times, np.full(n, unknown, dtype=np.int8), np.full(n, np.nan))
    try:
        flops, flops_known = int_array(frame, "flops")
        read, read_known = int_array(frame, "bytes_read")
        written, written_known = int_array(frame, "bytes_written")
        if n and max(int(read.max()), int(written.max())) >= 2**62:
            raise ValueError("bytes moved may not fit in int64")
    except ValueError:  # counts that are not all int64 (a profile made by hand): node by node
        return RooflineBounds.of_points(profile, peaks, roofline(profile, peaks, stat))
    known = flops_known & read_known & written_known
    dtype_codes, dtype_sets = column_codes(frame, "in_dtypes")
    peak_of_set = np.array([peaks.flops_for(d[0] if d else None) for d in dtype_sets],  # type: ignore[index]
                           dtype=np.float64)
    time_s = times_array(frame, stat, "auto")
    with np.errstate(divide="ignore", invalid="ignore"):
        compute_s = flops.astype(np.float64) / peak_of_set[dtype_codes]
        memory_s = (read + written).astype(np.float64) / peaks.bytes_per_s
        roof_s = np.maximum(compute_s, memory_s)
        fraction = np.where(time_s > 0, roof_s / np.where(time_s > 0, time_s, 1.0), np.inf)
    off_roof = (roof_s == 0) | (fraction < OVERHEAD_RATIO)
    out = np.where(compute_s >= memory_s, _CODE[Bound.COMPUTE], _CODE[Bound.MEMORY]).astype(np.int8)
    out[off_roof] = np.where(time_s[off_roof] < OVERHEAD_MAX_S, _CODE[Bound.OVERHEAD], _CODE[Bound.SLOW])
    out[~known] = unknown
    return RooflineBounds(profile, peaks, times, out, np.where(known, roof_s, np.nan))


def roofline(profile: Profile, peaks: Peaks | None = None, stat: str = "median") -> list[RooflinePoint]:
    """A RooflinePoint for every node of every graph (views and free ops included)."""
    peaks = peaks or peaks_from_meta(profile)
    frame = node_frame(profile)
    # On an accelerator the device time is the op's time; host time is only its dispatch.
    times = frame.times(stat, "auto")
    col = frame.column
    return [_point(node_id, flops, read, written, dtypes, t, peaks, graph_id)
            for node_id, flops, read, written, dtypes, t, graph_id in zip(
                col("id"), col("flops"), col("bytes_read"), col("bytes_written"), col("in_dtypes"), times,
                col("graph_id"))]
