"""Did the step get slower? The noise-aware check behind ``graphprof diff --fail-if-slower PCT``.

A CI gate that fires on noise gets switched off, so a slowdown counts only
when it is both large and real:

* **Step time** is each profiled step's wall time (``StepRecord.wall_time_s``);
  a profile whose steps carry no wall time uses the per-step sum of its
  nodes' host-time samples instead. Each profile is summarised by the median
  over its steps.
* **Large:** the after median exceeds the before median by more than PCT
  percent.
* **Real:** the difference of the medians exceeds a noise margin of
  ``NOISE_K`` standard errors of that difference. Each profile's standard
  error of the median comes from its own per-step spread:
  ``1.2533 × σ / √n`` with the robust ``σ = 1.4826 × MAD`` (median absolute
  deviation), so one slow step (a GC pause) does not inflate it, and more
  steps make the check sharper. The two standard errors add in quadrature.
* With a single profiled step in either profile the spread cannot be
  estimated: the gate then compares medians only and says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from graphprof.profile.model import Profile

#: Noise margin in standard errors of the difference of the medians (one-sided p ~ 0.001 for normal noise).
NOISE_K = 3.0
_MAD_TO_SIGMA = 1.4826
#: Standard error of a sample median relative to sigma / sqrt(n), for normal data (sqrt(pi / 2)).
_MEDIAN_SE = 1.2533


def step_times_s(profile: Profile) -> tuple[float, ...]:
    """Each profiled step's time: its wall time, or the sum of its node samples when no wall time was recorded."""
    walls = tuple(s.wall_time_s for s in profile.steps)
    if walls and all(w > 0 for w in walls):
        return walls
    n_steps = max((len(n.host_time_s) for _, n in profile.iter_nodes()), default=0)
    sums = [0.0] * n_steps
    for _, node in profile.iter_nodes():
        for i, t in enumerate(node.host_time_s):
            sums[i] += t
    return tuple(sums)


def median_standard_error_s(times_s: Sequence[float]) -> float | None:
    """The standard error of the median of ``times_s`` from their MAD; None with fewer than 2 samples."""
    if len(times_s) < 2:
        return None
    median = statistics.median(times_s)
    mad = statistics.median(abs(t - median) for t in times_s)
    return _MEDIAN_SE * _MAD_TO_SIGMA * mad / math.sqrt(len(times_s))


@dataclass(frozen=True)
class StepComparison:
    """Median step time of both profiles, their change, and the noise margin on it.

    ``noise_margin_s`` is None when either profile has a single profiled
    step (no spread to estimate); ``beyond_noise`` is then None too.
    """

    before_steps: int
    after_steps: int
    before_median_s: float
    after_median_s: float
    noise_margin_s: float | None

    @property
    def delta_s(self) -> float:
        return self.after_median_s - self.before_median_s

    @property
    def change_pct(self) -> float | None:
        """Percent change of the median step time; None when the before median is not > 0."""
        if not self.before_median_s > 0:
            return None
        return 100.0 * self.delta_s / self.before_median_s

    @property
    def beyond_noise(self) -> bool | None:
        """True when the medians differ (either way) by more than the noise margin."""
        if self.noise_margin_s is None:
            return None
        return abs(self.delta_s) > self.noise_margin_s


def compare_steps(before: Profile, after: Profile) -> StepComparison:
    """The median step times of two profiles and the noise margin on their difference."""
    a, b = step_times_s(before), step_times_s(after)
    se_a, se_b = median_standard_error_s(a), median_standard_error_s(b)
    margin = None if se_a is None or se_b is None else NOISE_K * math.hypot(se_a, se_b)
    return StepComparison(
        before_steps=len(a), after_steps=len(b),
        before_median_s=statistics.median(a) if a else 0.0, after_median_s=statistics.median(b) if b else 0.0,
        noise_margin_s=margin,
    )


def parse_percent(text: str) -> float:
    """``5``, ``5%`` or ``2.5`` as a percentage >= 0; ValueError with one sentence otherwise."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"--fail-if-slower takes a percentage >= 0 such as 5 or 2.5%, not {text!r}")
    return value


@dataclass(frozen=True)
class RegressionGate:
    """The verdict of ``--fail-if-slower threshold_pct`` and the one sentence that explains it."""

    threshold_pct: float
    steps: StepComparison
    regressed: bool
    reason: str


def regression_gate(steps: StepComparison, threshold_pct: float) -> RegressionGate:
    """Regressed when the median step got slower by more than ``threshold_pct`` % and beyond noise."""
    if isinstance(threshold_pct, bool) or not isinstance(threshold_pct, (int, float)) or not threshold_pct >= 0:
        raise ValueError(f"--fail-if-slower must be a percentage >= 0, not {threshold_pct!r}")
    change = steps.change_pct
    if change is None:
        return RegressionGate(threshold_pct, steps, False, "the before profile has no step time, so nothing to compare")
    slower = change > threshold_pct
    head = f"median step time changed by {change:+.1f}% (threshold {threshold_pct:g}%)"
    if steps.noise_margin_s is None:
        which, n = ("the before profile", steps.before_steps) if steps.before_steps < 2 else \
            ("the after profile", steps.after_steps)
        return RegressionGate(threshold_pct, steps, slower,
                              f"{head}; {which} has {'a single' if n == 1 else 'no'} profiled step, so noise "
                              f"cannot be estimated and medians are compared only")
    if not slower:
        return RegressionGate(threshold_pct, steps, False, f"{head}: within the threshold")
    if steps.delta_s <= steps.noise_margin_s:
        return RegressionGate(threshold_pct, steps, False,
                              f"{head}, but the difference is within the noise margin "
                              f"({NOISE_K:g} standard errors of the step medians)")
    return RegressionGate(threshold_pct, steps, True,
                          f"{head}, beyond the noise margin ({NOISE_K:g} standard errors of the step medians)")
