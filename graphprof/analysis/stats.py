"""Statistics over a node's per-step samples.

Samples are kept raw in the profile; which statistic a view shows is the
view's choice (median by default: robust to one slow step).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

StatFn = Callable[[Sequence[float]], float]
#: A median absolute deviation times this estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826


def _median(xs: Sequence[float]) -> float:
    """``statistics.median`` (same result) without its overhead: it runs once per node of a profile."""
    n = len(xs)
    if n == 1:
        return xs[0]
    if n == 0:
        return 0.0
    s = sorted(xs)
    half = n // 2
    return s[half] if n % 2 else (s[half - 1] + s[half]) / 2


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else 0.0


def _min(xs: Sequence[float]) -> float:
    return min(xs) if xs else 0.0


def _max(xs: Sequence[float]) -> float:
    return max(xs) if xs else 0.0


def _stdev(xs: Sequence[float]) -> float:
    if len(xs) <= 1:
        return 0.0
    import statistics  # here: its import (fractions, decimal) was a part of every command's start

    return statistics.stdev(xs)


#: The one median of the package (same result as ``statistics.median``).
median = _median

STATS: dict[str, StatFn] = {"median": _median, "mean": _mean, "min": _min, "max": _max, "stdev": _stdev}


def stat_fn(name: str) -> StatFn:
    """The statistic called ``name``; ValueError names the valid ones."""
    try:
        return STATS[name]
    except KeyError:
        raise ValueError(f"unknown statistic {name!r}; choose one of {', '.join(STATS)}") from None
