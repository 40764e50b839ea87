"""The eager-overhead finding: measured eager calls against probe-free replays; quiet within noise."""

from __future__ import annotations

import json

import pytest

from graphprof.analysis.advisor import advise
from graphprof.analysis.eager import eager_overhead, replay_step_times_s
from graphprof.analysis.report import build_report
from graphprof.api import Profile
from graphprof.profile.model import GraphKind, GraphRecord, ProfileMeta, StepRecord
from graphprof.profile.model import load_profile
from graphprof.profile.step_facts import EagerCalls, eager_calls, eager_note, with_eager_times
from graphprof.render.report_text import render_report
from tests.render.export_profiles import make_profile, node

MS = 1e-3


def _replayed(walls_ms=(10.0, 10.4, 9.8), probe_cost_s=0.0) -> Profile:
    """Ten 0.9 ms ops per step; the steps' wall times as given."""
    nodes = [node(i, "mm", times=tuple(0.9 * MS for _ in walls_ms)) for i in range(10)]
    p = make_profile(nodes, meta=ProfileMeta(function="step", probe_cost_s=probe_cost_s))
    steps = tuple(StepRecord(index=3 + k, wall_time_s=w * MS, graph_time_s=9 * MS) for k, w in enumerate(walls_ms))
    return Profile(meta=p.meta, steps=steps, graphs=p.graphs)


def test_probes_are_taken_off_replayed_steps_but_never_below_the_ops() -> None:
    p = _replayed(probe_cost_s=50e-6)  # 10 probes: 0.5 ms per step
    assert replay_step_times_s(p) == pytest.approx((9.5 * MS, 9.9 * MS, 9.3 * MS))
    huge = _replayed(probe_cost_s=1.0)
    assert replay_step_times_s(huge) == pytest.approx((9 * MS,) * 3)


def test_finding_on_a_step_whose_eager_calls_are_slower() -> None:
    p = with_eager_times(_replayed(), [60 * MS, 14 * MS, 15 * MS, 14.5 * MS], first_is_cold=True)
    e = eager_overhead(p)
    assert e.significant and e.eager_calls == 3 and e.first_call_s == pytest.approx(60 * MS)
    assert e.eager_s == pytest.approx(14.5 * MS) and e.replay_s == pytest.approx(10 * MS)
    assert e.overhead_s == pytest.approx(4.5 * MS) and e.share == pytest.approx(4.5 / 14.5)
    (finding,) = [f for f in advise(p) if f.rule == "eager-overhead"]
    assert finding.time_s == pytest.approx(4.5 * MS) and finding.severity.value == "high"
    assert "1.45x" in finding.title and "torch.compile" in finding.hint
    text = render_report(build_report(p))
    assert "eager vs graph: eager step 14.5 ms" in text and "the static graph removes 4.5 ms (31%" in text


@pytest.mark.parametrize("eager_ms", [
    [60.0, 10.2, 10.1, 10.3],   # within 5% of the replay
    [60.0, 9.0, 14.0, 14.0],    # one warm call faster than a typical replay: noise
    [60.0],                     # only the cold first call
])
def test_quiet_when_the_gap_is_noise_or_unmeasured(eager_ms) -> None:
    p = with_eager_times(_replayed(), [t * MS for t in eager_ms], first_is_cold=True)
    assert not any(f.rule == "eager-overhead" for f in advise(p))
    e = eager_overhead(p)
    assert e is None or not e.significant


def test_quiet_without_eager_calls_and_robust_to_bad_entries() -> None:
    p = _replayed()
    assert eager_overhead(p) is None and eager_calls(p) is None
    for bad in ({"wall_time_s": "fast"}, {"wall_time_s": [1.0, -2.0]}, [1, 2], {"wall_time_s": []}):
        q = Profile(meta=ProfileMeta(extra={"eager": bad}), steps=p.steps, graphs=p.graphs)
        assert eager_calls(q) is None and eager_overhead(q) is None


def test_eager_times_survive_saving(tmp_path) -> None:
    p = with_eager_times(_replayed(), [30 * MS, 12 * MS], first_is_cold=True)
    path = tmp_path / "p.json"
    p.save(str(path))
    assert eager_calls(load_profile(str(path))) == EagerCalls((30 * MS, 12 * MS), True)
    assert json.loads(path.read_text())["meta"]["extra"]["eager"]["first_is_cold"] is True
    assert eager_note([]) == {} and EagerCalls((1.0, 2.0), first_is_cold=False).warm_time_s == (1.0, 2.0)


def test_host_graphs_carry_no_probes() -> None:
    p = _replayed(probe_cost_s=50e-6)
    host = GraphRecord(id=1, name="host", kind=GraphKind.HOST, nodes=(node(0, "zero_grad"),))
    q = Profile(meta=p.meta, steps=p.steps, graphs=(*p.graphs, host))
    assert replay_step_times_s(q) == replay_step_times_s(p)


def test_report_line_when_the_replay_is_slower() -> None:
    p = with_eager_times(_replayed(), [60 * MS, 6 * MS, 6 * MS], first_is_cold=True)
    text = render_report(build_report(p))
    assert "the profiled replay was 4 ms (67% of the eager step) slower than eager" in text
    assert "eager-overhead" not in {f.rule for f in advise(p)}
