"""Did the step get slower? The noise-aware check behind ``graphprof diff --fail-if-slower PCT``.

A CI gate that fires on noise gets switched off, so a slowdown counts only
when it is both large and real:

* **Step time** is each profiled step's wall time (``StepRecord.wall_time_s``);
  a profile whose steps carry no wall time uses the per-step sum of its
  nodes' host-time samples instead. Each profile is summarised by the median
  over its steps.
* **Large:** the after median exceeds the before median by more than PCT
  percent.
* **Real:** the difference of the medians exceeds a noise margin: the
  one-sided 0.1% Student-t bound on that difference. Identical code gives
  both profiles the same noise, so one robust ``σ = 1.4826 × MAD`` is pooled
  from both profiles' deviations from their own medians (the median step of
  an odd count, whose deviation is 0 by construction, is left out); the
  standard error of the difference is ``1.2533 × σ × √(1/n₁ + 1/n₂)`` and the
  margin ``t(0.999, n₁ + n₂ - 2)`` of them. One slow step (a GC pause) does
  not inflate σ, and the t quantile pays for estimating σ from few steps:
  per-profile MADs with a fixed 3 standard errors fired on identical code in
  2-7% of simulated pairs of 3 to 5 steps. ``benchmarks/gate_false_positives.py``
  measures the rate; the README states it.
* With a single profiled step in either profile the spread cannot be
  estimated: the gate then compares medians only and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from graphprof.analysis.stats import MAD_TO_SIGMA, median
from graphprof.analysis.frame import node_frame
from graphprof.profile.model import NS_PER_S, Profile

#: One-sided 0.999 quantiles of Student's t by degrees of freedom (above 30: the normal 3.09 at 120+).
_T_999 = {1: 318.31, 2: 22.327, 3: 10.215, 4: 7.173, 5: 5.893, 6: 5.208, 7: 4.785, 8: 4.501, 9: 4.297,
          10: 4.144, 11: 4.025, 12: 3.930, 13: 3.852, 14: 3.787, 15: 3.733, 16: 3.686, 17: 3.646, 18: 3.610,
          19: 3.579, 20: 3.552, 25: 3.450, 30: 3.385, 40: 3.307, 60: 3.232, 120: 3.160}
NOISE_LEVEL = "one-sided 0.1% Student-t bound"
#: Standard error of a sample median relative to sigma / sqrt(n), for normal data (sqrt(pi / 2)).
_MEDIAN_SE = 1.2533


def step_times_s(profile: Profile) -> tuple[float, ...]:
    """Each profiled step's time: its wall time, or the sum of its node samples when no wall time was recorded."""
    walls = tuple(s.wall_time_s for s in profile.steps)
    if walls and all(w > 0 for w in walls):
        return walls
    samples = node_frame(profile).column("host_time_ns")  # a column: no NodeRecord is needed
    sums = [0.0] * max(map(len, samples), default=0)
    for node_ns in samples:
        for i, t in enumerate(node_ns):
            sums[i] += t / NS_PER_S
    return tuple(sums)


def t_critical(df: int) -> float:
    """The one-sided 0.999 quantile of Student's t with ``df`` degrees of freedom (conservative between table rows)."""
    rows = [k for k in _T_999 if k <= df]
    return _T_999[max(rows)] if rows else _T_999[1]


def pooled_sigma_s(a: Sequence[float], b: Sequence[float]) -> float:
    """A robust σ of step noise pooled from both samples: 1.4826 × MAD of the deviations from each median.

    For an odd count the median step's own deviation (0 by construction) is
    left out, or three steps would give a MAD biased low by a third.
    """
    deviations: list[float] = []
    for times in (a, b):
        centre = median(times)
        own = sorted(abs(t - centre) for t in times)
        deviations.extend(own[1:] if len(own) % 2 else own)
    return MAD_TO_SIGMA * median(deviations) if deviations else 0.0


def noise_margin_s(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The margin the difference of the medians of ``a`` and ``b`` must exceed; None with fewer than 2 of either."""
    if len(a) < 2 or len(b) < 2:
        return None
    se = _MEDIAN_SE * pooled_sigma_s(a, b) * math.sqrt(1 / len(a) + 1 / len(b))
    return t_critical(len(a) + len(b) - 2) * se


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
    return compare_step_times(step_times_s(before), step_times_s(after))


def compare_step_times(a: Sequence[float], b: Sequence[float]) -> StepComparison:
    """``compare_steps`` on step times (seconds) directly."""
    margin = noise_margin_s(a, b)
    return StepComparison(
        before_steps=len(a), after_steps=len(b),
        before_median_s=median(a) if a else 0.0, after_median_s=median(b) if b else 0.0,
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
                              f"({NOISE_LEVEL} on the difference of the step medians)")
    return RegressionGate(threshold_pct, steps, True,
                          f"{head}, beyond the noise margin ({NOISE_LEVEL} on the difference of the step medians)")
