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

from dataclasses import dataclass

from graphprof.analysis.stats import MAD_TO_SIGMA, STATS, median as median_of
from graphprof.profile.model import OVERHEAD_OP, Profile

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
    median = median_of(walls)
    mad = median_of([abs(w - median) for w in walls]) * MAD_TO_SIGMA
    outliers = []
    for step in profile.steps:
        deviation = abs(step.wall_time_s - median)
        if median > 0 and deviation > _RELATIVE_FLOOR * median and deviation > threshold * mad:
            outliers.append(StepOutlier(step.index, step.wall_time_s, step.wall_time_s / median))
    return StepStats(
        steps=len(walls), median_s=median, mean_s=STATS["mean"](walls), min_s=min(walls), max_s=max(walls),
        stdev_s=STATS["stdev"](walls), outliers=tuple(outliers),
    )


@dataclass(frozen=True)
class StepAccount:
    """Where one step's wall time went: the user's nodes, graphprof's own node, and the rest."""

    index: int
    wall_time_s: float
    nodes_s: float  # every node of every graph but graphprof's own
    overhead_s: float  # the ``graphprof.overhead`` node (0 where the profile has none)

    @property
    def coverage(self) -> float:
        """The share of the wall time the user's nodes account for."""
        return self.nodes_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def unaccounted_s(self) -> float:
        """Wall time neither the nodes nor graphprof's node account for (0 for a whole-step profile)."""
        return self.wall_time_s - self.nodes_s - self.overhead_s


def step_accounts(profile: Profile) -> list[StepAccount]:
    """Each step's wall time split into node time and graphprof's own time, step by step.

    Taken per step (node times of step k against the wall time of step k), not
    as a sum of per-node medians against a median step: a loaded machine slows
    a step's nodes and its wall time alike, so the per-step share holds still.
    """
    user: list[float] = [0.0] * len(profile.steps)
    own: list[float] = [0.0] * len(profile.steps)
    for graph in profile.graphs:
        for node in graph.nodes:
            into = own if node.op == OVERHEAD_OP else user
            for k, t in enumerate(node.host_time_s[:len(into)]):
                into[k] += t
    return [StepAccount(step.index, step.wall_time_s, user[k], own[k]) for k, step in enumerate(profile.steps)]
