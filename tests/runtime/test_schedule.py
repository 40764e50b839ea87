"""Schedules (fake clock): which calls are skipped/warm/active, callbacks, statistics, bounded memory."""

from __future__ import annotations

import itertools

import pytest
import torch

import graphprof
from graphprof.analysis.stats import STATS
from graphprof.runtime.schedule import Action, schedule

N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


def test_torch_profiler_documented_example() -> None:
    # torch.profiler docs: skip_first=10, wait=5, warmup=1, active=3, repeat=2
    sched = schedule(skip_first=10, wait=5, warmup=1, active=3, repeat=2)
    actions = [sched(i) for i in range(30)]
    assert actions[:10] == [N] * 10
    assert actions[10:19] == [N] * 5 + [W] + [R, R, S]
    assert actions[19:28] == [N] * 5 + [W] + [R, R, S]
    assert actions[28:] == [N, N]  # repeat=2: nothing after two cycles


@pytest.mark.parametrize("kwargs, expected", [
    (dict(warmup=1, active=3), [W, R, R, S, W, R, R, S]),
    (dict(wait=1, warmup=0, active=1), [N, S, N, S, N, S, N, S]),
    (dict(skip_first=2, wait=0, warmup=1, active=2, repeat=1), [N, N, W, R, S, N, N, N]),
])
def test_other_schedules(kwargs, expected) -> None:
    sched = schedule(**kwargs)
    assert [sched(i) for i in range(8)] == expected


def test_bad_schedules() -> None:
    with pytest.raises(ValueError, match="active must be at least 1"):
        schedule(active=0)
    with pytest.raises(ValueError, match="wait must be a non-negative integer"):
        schedule(wait=-1)


class FakeClock:
    """Advances 1 us per reading: every node of a step takes exactly 1 us."""

    def __init__(self) -> None:
        self.ticks = itertools.count(0, 1000)

    def __call__(self) -> int:
        return next(self.ticks)


def _step_fn():
    w = torch.ones(4)

    def step(x):
        w.mul_(0.5).add_(x)
        return (w * 2).sum()

    return step


def test_callbacks_fire_at_cycle_ends_with_only_active_steps() -> None:
    ready = []
    fn = graphprof.trace(_step_fn(), schedule=schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2),
                         on_profile_ready=ready.append, clock=FakeClock())
    calls_when_ready = []
    for call in range(12):
        fn(torch.ones(4))
        if len(ready) > len(calls_when_ready):
            calls_when_ready.append(call)
    assert calls_when_ready == [5, 9]
    assert [[s.index for s in p.steps] for p in ready] == [[4, 5], [8, 9]]
    assert fn.get_profile() is ready[-1]
    assert fn.get_profile(all=True) == ready
    assert [p.meta.schedule.cycle for p in ready if p.meta.schedule is not None] == [0, 1]
    # fake clock: each node took exactly 1 us in every recorded step
    nodes = ready[0].graphs[0].nodes
    assert all(n.host_time_s == pytest.approx((1e-6, 1e-6)) for n in nodes)


def test_get_profile_before_any_cycle_is_a_clear_error() -> None:
    fn = graphprof.trace(_step_fn(), schedule=schedule(wait=5, active=1))
    fn(torch.ones(4))
    with pytest.raises(RuntimeError, match="no profiling cycle .* has completed yet"):
        fn.get_profile()
    fresh = graphprof.trace(_step_fn())
    with pytest.raises(RuntimeError, match="no profiled step yet"):
        fresh.get_profile()


def test_waiting_steps_run_without_probes() -> None:
    fn = graphprof.trace(_step_fn(), schedule=schedule(wait=3, warmup=0, active=1, repeat=1), clock=FakeClock())
    for _ in range(3):
        fn(torch.ones(4))
    # calls 0-2 are waiting: call 0 eager, 1 capture, 2 replay without probes
    entry = fn.runner
    assert len(entry.samples) == 0
    fn(torch.ones(4))  # call 3 is the active one
    assert [s.index for s in fn.get_profile().steps] == [3]


def test_memory_is_bounded_whatever_the_number_of_steps() -> None:
    fn = graphprof.trace(_step_fn(), schedule=schedule(warmup=0, active=2), clock=FakeClock())
    for _ in range(50):
        fn(torch.ones(4))
        assert len(fn.runner.samples) <= 2 if fn.runner else True
    unscheduled = graphprof.trace(_step_fn(), max_steps=5, clock=FakeClock())
    for _ in range(50):
        unscheduled(torch.ones(4))
    assert [s.index for s in unscheduled.get_profile().steps] == list(range(45, 50))


def test_statistics_across_steps_and_outliers() -> None:
    from graphprof.analysis.steps import step_stats
    from graphprof.profile import Profile, StepRecord

    walls = [1.0, 1.01, 0.99, 1.0, 3.0, 1.02]
    profile = Profile(steps=tuple(StepRecord(index=i, wall_time_s=w) for i, w in enumerate(walls)))
    stats = step_stats(profile)
    assert stats.median_s == pytest.approx(1.005) and stats.max_s == 3.0 and stats.min_s == 0.99
    assert [o.index for o in stats.outliers] == [4]
    steady = Profile(steps=tuple(StepRecord(index=i, wall_time_s=1.0 + 1e-9 * i) for i in range(5)))
    assert step_stats(steady).outliers == ()
    assert STATS["stdev"]([1.0, 3.0]) == pytest.approx(1.4142135, rel=1e-6)


def test_reset_starts_over() -> None:
    fn = graphprof.trace(_step_fn(), clock=FakeClock())
    for _ in range(4):
        fn(torch.ones(4))
    fn.reset()
    with pytest.raises(RuntimeError):
        fn.get_profile()
    for _ in range(3):  # eager, capture, one profiled step
        fn(torch.ones(4))
    assert [s.index for s in fn.get_profile().steps] == [2]
