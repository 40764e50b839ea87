"""Statistics across profiled steps, and which steps are outliers.

Per-node statistics come from ``analysis.stats`` over each node's samples.
Here it is whole steps: their wall time's median, mean, spread, and the
steps that stand out (a step with a GC pause, a page fault storm or a noisy
neighbour), which users should not trust or should re-run.

Outlier rule: a step is flagged when its wall time is more than
``threshold`` robust standard deviations (1.4826 x median absolute
deviation) from the median *and* more than 10% away from it. The 10% floor
keeps perfectly steady runs (MAD near 0) from flagging tiny wobbles.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from graphprof.analysis.stats import STATS
from graphprof.profile.model import Profile

_MAD_TO_SIGMA = 1.4826
_RELATIVE_FLOOR = 0.10


@dataclass(frozen=True)
class StepOutlier:
    """A step whose wall time stands out, and by how much."""

    index: int
    wall_time_s: float
    ratio_to_median: float


@dataclass(frozen=True)
class StepStats:
    """Wall-time statistics of a profile's steps."""

    steps: int
    median_s: float
    mean_s: float
    min_s: float
    max_s: float
    stdev_s: float
    outliers: tuple[StepOutlier, ...]


def step_stats(profile: Profile, threshold: float = 3.5) -> StepStats:
    """Wall-time statistics and outliers over the profile's steps."""
    walls = [s.wall_time_s for s in profile.steps]
    if not walls:
        return StepStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, ())
    median = statistics.median(walls)
    mad = statistics.median(abs(w - median) for w in walls) * _MAD_TO_SIGMA
    outliers = []
    for step in profile.steps:
        deviation = abs(step.wall_time_s - median)
        if median > 0 and deviation > _RELATIVE_FLOOR * median and deviation > threshold * mad:
            outliers.append(StepOutlier(step.index, step.wall_time_s, step.wall_time_s / median))
    return StepStats(
        steps=len(walls), median_s=median, mean_s=STATS["mean"](walls), min_s=min(walls), max_s=max(walls),
        stdev_s=STATS["stdev"](walls), outliers=tuple(outliers),
    )
