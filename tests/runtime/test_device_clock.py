"""The device clock with a fake event clock: marks, per-node device time, one sync per step, isolated mode.

No accelerator is needed: a fake device stamps every recorded event with a
scripted time, so the arithmetic (which events bound which node, ms -> s,
host next to device time, how often the device is synchronised) is checked
exactly, through the whole ``graphprof.trace`` pipeline, on any machine.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys

import pytest
import torch
from torch import nn

import graphprof
from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.advisor import advise
from graphprof.analysis.report import build_report
from graphprof.analysis.roofline import Peaks
from graphprof.capture.captured_step import run_captured
from graphprof.capture.whole_step import capture_whole_step
from graphprof.passes.annotate import annotate, is_op_node
from graphprof.passes.device_probes import add_device_marks, event_count, timed_op_nodes
from graphprof.passes.instrument import instrument
from graphprof.passes.records import PROBE
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, Phase, Profile, ProfileMeta, StepRecord
from graphprof.render.report_text import render_report
from graphprof.runtime.allocator import AllocatorSampler, add_allocator_samples
from graphprof.runtime.device_clock import DeviceClock, DeviceTimeline, graph_accelerator

US = 1e-6


class FakeDevice:
    """A device whose clock advances ``k`` microseconds when the ``k``-th event of a step is recorded.

    Counting events from 0, event ``j`` of a step is recorded as the
    ``(j + 1)``-th, so events ``i`` and ``i + 1`` are ``i + 2`` us apart,
    whatever the host does. ``syncs`` counts synchronisations, ``records``
    recorded events, ``events_made`` events created.
    """

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.in_step = 0
        self.syncs = 0
        self.records = 0
        self.events_made = 0

    def event(self) -> "FakeEvent":
        self.events_made += 1
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.syncs += 1

    def clock(self, **kwargs: object) -> DeviceClock:
        return DeviceClock(device="fakegpu:0", event_factory=self.event, synchronize=self.synchronize,
                           stream=self._stream, name="Fake GPU 9000", capability="sm_99", **kwargs)

    def _stream(self) -> None:
        self.in_step = 0  # begin_step asks for the stream: a new step starts
        return None


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.stamp_ms: float | None = None

    def record(self, stream: object = None) -> None:
        d = self.device
        d.in_step += 1
        d.records += 1
        d.now_ms += d.in_step * 1e-3
        self.stamp_ms = d.now_ms

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.stamp_ms is not None and end.stamp_ms is not None, "event read before it was recorded"
        return end.stamp_ms - self.stamp_ms


def _host_clock():
    """A host clock that advances 1000 ns per reading."""
    ticks = itertools.count(0, 1000)
    return lambda: next(ticks)


def _step_factory(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(5, 6, generator=g), torch.randn(5, 2, generator=g)


def _traced_run(steps: int, **options):
    model, step = _step_factory()
    fn = graphprof.trace(step, **options)
    losses = [fn(*_inputs(i)) for i in range(steps)]
    return model, fn, losses


# -- the pass ------------------------------------------------------------------------
def _instrumented():
    w = torch.ones(3)
    captured = capture_whole_step(lambda x: (x * w).relu().sum(), (torch.arange(3.0),), {})
    annotate(captured.graph_module)
    ticks = _host_clock()

    def host_tick() -> int:
        return ticks()

    return captured, instrument(captured.graph_module, host_tick)


def _calls(n: torch.fx.Node) -> str:
    if PROBE in n.meta:
        return "host" if n.target.__name__ == "host_tick" else "mark"
    return "op" if is_op_node(n) else n.op


@pytest.mark.parametrize("isolated", [False, True])
def test_marks_sit_between_op_nodes_outputs_unchanged(isolated: bool) -> None:
    captured, inst = _instrumented()
    x = torch.arange(3.0)
    expected = run_captured(captured, captured.graph_module, [x])[0]
    ops = len(timed_op_nodes(inst))
    calls: list[str] = []

    def mark() -> None:
        calls.append("start")

    def mark_end() -> None:
        calls.append("end")

    placed = add_device_marks(inst, mark, mark_end if isolated else None)
    assert placed == event_count(ops, isolated) == (2 * ops if isolated else ops + 1)
    layout = [_calls(n) for n in inst.graph.nodes if n.op == "call_function"]
    if isolated:  # host stamp, then every op between its own start and end mark
        assert layout == ["host"] + ["mark", "op", "mark", "host"] * ops
        assert calls == []
    else:  # a mark ahead of the first host stamp, then one right after every op
        assert layout == ["mark", "host"] + ["op", "mark", "host"] * ops
    result, stamps, _ = run_captured(captured, inst, [x], instrumented=True)
    assert torch.equal(result, expected) and len(stamps) == ops + 1  # outputs unchanged
    assert calls == (["start", "end"] * ops if isolated else ["start"] * (ops + 1))


def test_marks_go_between_an_op_and_its_allocator_read() -> None:
    captured, inst = _instrumented()
    reads: list[int] = []

    class Recording(AllocatorSampler):
        def read(self, node_id: int) -> None:  # no accelerator here: record the call only
            reads.append(node_id)

    add_allocator_samples(inst, Recording(1))
    add_device_marks(inst, lambda: None)
    layout = [_calls(n) if getattr(n.target, "__name__", "") != "read" else "read" for n in inst.graph.nodes
              if n.op == "call_function"]
    ops = len(timed_op_nodes(inst))
    assert layout == ["mark", "host"] + ["op", "mark", "read", "host"] * ops  # host work never delays an event
    x = torch.arange(3.0)
    result = run_captured(captured, inst, [x], instrumented=True)[0]
    assert torch.equal(result, run_captured(captured, captured.graph_module, [x])[0])  # outputs unchanged
    assert len(reads) == ops


def test_cpu_graphs_get_no_device_probes() -> None:
    captured, _ = _instrumented()
    assert graph_accelerator(captured.graph_module) is None  # its tensors are on the CPU
    profile = _traced_run(4)[1].get_profile()
    assert all(not n.device_time_s for _, n in profile.iter_nodes())
    assert profile.meta.device_type == "cpu" and profile.meta.device is not None and profile.meta.device.timing == "host"


# -- the arithmetic --------------------------------------------------------------------
def test_timeline_reads_consecutive_events_in_ns() -> None:
    device = FakeDevice()
    timeline = DeviceTimeline(device.clock(), nodes=4)
    mark, end_mark = timeline.mark_functions()
    assert end_mark is None and timeline.events_per_step == 5 and device.events_made == 5
    for step in (7, 8):
        timeline.begin_step()
        for _ in range(5):
            mark()
        timeline.finish()
        timeline.end_step(step)
    # node i spans events i and i+1; event i+1 is the (i+2)-th recorded, so the device advanced i+2 us
    expected = tuple((i + 2) * 1000 for i in range(4))  # whole ns, the unit of every sample
    assert timeline.times([7, 8]) == [expected] * 2
    assert timeline.times([7, 9]) is None  # a step without device times
    assert device.syncs == 2 and device.events_made == 5  # events are reused across steps


def test_times_are_placed_by_node_id() -> None:
    timeline = DeviceTimeline(FakeDevice().clock(), nodes=3, node_ids=[0, 2, 3])
    mark, _ = timeline.mark_functions()
    timeline.begin_step()
    for _ in range(4):
        mark()
    timeline.finish()
    timeline.end_step(0)
    assert timeline.times([0]) == [(2000, 0, 3000, 4000)]  # ns


def test_a_step_that_skipped_marks_is_an_error_not_a_wrong_time() -> None:
    timeline = DeviceTimeline(FakeDevice().clock(), nodes=3)
    mark, _ = timeline.mark_functions()
    timeline.begin_step()
    mark()
    timeline.finish()
    with pytest.raises(RuntimeError, match="device events"):
        timeline.end_step(0)


def test_traced_step_device_self_time_per_node_host_beside_it_one_sync_per_step() -> None:
    device = FakeDevice()
    model, fn, losses = _traced_run(6, clock=_host_clock(), device_clock=device.clock())
    eager_model, eager_step = _step_factory()
    eager_losses = [eager_step(*_inputs(i)) for i in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(losses, eager_losses))  # outputs unchanged
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager_model.parameters()))
    profile = fn.get_profile()
    step = profile.graphs[0]
    n = len(step.nodes)
    profiled = len(profile.steps)
    assert profiled == 4  # call 1 eager, call 2 captures, calls 3 to 6 are recorded
    assert device.syncs == profiled  # ONE synchronisation per step, none per node
    assert device.records == profiled * (n + 1)
    for node in step.nodes:
        # device: event id+1 minus event id; host: one fake host tick between consecutive probes
        assert node.device_time_s == pytest.approx(((node.id + 2) * US,) * profiled, rel=1e-9)
        assert node.host_time_s == pytest.approx((1000e-9,) * profiled)
    meta = profile.meta
    assert (meta.device_type, meta.device_name) == ("fakegpu", "Fake GPU 9000")
    assert meta.device is not None and (meta.device.timing, meta.device.capability) == ("pipelined", "sm_99")


def test_isolated_timing_syncs_after_every_node() -> None:
    device = FakeDevice()
    model, fn, losses = _traced_run(5, device_clock=device.clock(), timing="isolated")
    _, eager_step = _step_factory()
    assert all(torch.equal(a, eager_step(*_inputs(i))) for i, a in enumerate(losses))  # outputs unchanged
    profile = fn.get_profile()
    n = len(profile.graphs[0].nodes)
    profiled = len(profile.steps)
    assert device.syncs == profiled * (n + 1)  # after every node, and the step's own
    assert device.records == profiled * 2 * n
    for node in profile.graphs[0].nodes:  # node i spans events 2i and 2i+1
        assert node.device_time_s == pytest.approx(((2 * node.id + 2) * US,) * profiled, rel=1e-9)
    assert profile.meta.device is not None and profile.meta.device.timing == "isolated"


def test_timing_option_is_validated() -> None:
    with pytest.raises(ValueError, match="timing must be one of pipelined, isolated"):
        graphprof.trace(lambda x: x, timing="exact")


def test_device_times_survive_save_and_load(tmp_path) -> None:
    device = FakeDevice()
    _, fn, _ = _traced_run(4, device_clock=device.clock())
    profile = fn.get_profile()
    path = tmp_path / "device.json"
    profile.save(str(path))
    loaded = graphprof.load(str(path))
    assert [n.device_time_s for _, n in loaded.iter_nodes()] == [n.device_time_s for _, n in profile.iter_nodes()]


def test_pipelined_and_isolated_compare_with_diff_on_the_device_clock() -> None:
    pipelined = _traced_run(4, device_clock=FakeDevice().clock())[1].get_profile()
    isolated = _traced_run(4, device_clock=FakeDevice().clock(), timing="isolated")[1].get_profile()
    result = graphprof.diff(pipelined, isolated, aggregate_by="type", clock="device")
    assert result.clock == "device" and result.mode == "nodes"

    def by_type(profile: Profile) -> dict[str, float]:
        out: dict[str, float] = {}
        for _, node in profile.iter_nodes():
            if node.device_time_s:
                out[node.type] = out.get(node.type, 0.0) + statistics.median(node.device_time_s)
        return out

    # the fake device makes isolated node i take (2i+2) us against (i+2) us pipelined: the diff sees it per op type
    before, after = by_type(pipelined), by_type(isolated)
    groups = {g.key: g for g in result.aggregates["type"]}
    assert set(before) <= set(groups)
    for op_type, seconds in before.items():
        assert groups[op_type].before_time_s == pytest.approx(seconds)
        assert groups[op_type].after_time_s == pytest.approx(after[op_type]) and after[op_type] > seconds


# -- analysis: host beside device, launch-bound steps -----------------------------------------
PEAKS = {"flops_per_s": 1e14, "bytes_per_s": 2e12}


def _node(i: int, host_us: float, device_us: float | None, flops: int = 10_000, moved: int = 40_000) -> NodeRecord:
    return NodeRecord(id=i, name=f"add_{i}", op="aten.add.Tensor", type="add", inputs=(i - 1,) if i else (),
                      in_shapes=((100,),), in_dtypes=("float32",), phase=Phase.FORWARD, source=f"model.py:{10 + i}",
                      flops=flops, bytes_read=moved // 2, bytes_written=moved // 2,
                      host_time_ns=seconds_to_ns((host_us * US,) * 3),
                      device_time_ns=seconds_to_ns((device_us * US,) * 3 if device_us is not None else ()))


def _hand_profile(pairs: list[tuple[float, float | None]], peaks: dict | None = PEAKS) -> Profile:
    nodes = tuple(_node(i, h, d) for i, (h, d) in enumerate(pairs))
    step_s = sum(max(h, d or 0) for h, d in pairs) * US
    return Profile(meta=ProfileMeta(function="step", device_type="cuda", device_name="GPU", peaks=dict(peaks or {})),
                   steps=tuple(StepRecord(i, step_s) for i in range(3)),
                   graphs=(GraphRecord(0, "step", GraphKind.STEP, nodes),))


def _rules(profile: Profile) -> dict:
    return {f.rule: f for f in advise(profile)}


def test_launch_bound_when_device_time_tracks_dispatch_of_tiny_kernels() -> None:
    # 30 tiny adds: the device takes as long per node as the host takes to launch it (~12 us), while
    # their roofline time is 20 ns: the device idles, waiting for the host.
    waiting = _hand_profile([(12.0, 11.0 + (i % 3)) for i in range(30)])
    finding = _rules(waiting)["launch-bound"]
    assert len(finding.nodes) == 30 and "host" in finding.title
    assert "CUDA graph" in finding.hint or "reduce-overhead" in finding.hint
    # The same ops behind a queue (device time far above dispatch): the device sets the pace.
    busy = _hand_profile([(5.0, 200.0) for _ in range(30)])
    assert "launch-bound" not in _rules(busy)
    # Host times only (a CPU profile): nothing to compare.
    assert "launch-bound" not in _rules(_hand_profile([(12.0, None) for _ in range(30)]))


def test_launch_bound_needs_most_of_the_step() -> None:
    # 5 host-paced tiny nodes beside 5 big device-bound kernels that hold most of the device time
    mixed = _hand_profile([(12.0, 12.0)] * 5 + [(5.0, 900.0)] * 5)
    assert "launch-bound" not in _rules(mixed)


def test_report_shows_host_and_device_time_side_by_side() -> None:
    profile = _hand_profile([(12.0, 11.0) for _ in range(30)] + [(5.0, 300.0)])
    report = build_report(profile, Peaks(**PEAKS))
    assert report.host_device is not None
    assert report.host_device.host_s == pytest.approx(sum([12.0] * 30 + [5.0]) * US)
    assert report.host_device.device_s == pytest.approx(sum([11.0] * 30 + [300.0]) * US)
    top = report.roofline_rows[0]
    assert top.node.id == 30 and top.point.time_s == pytest.approx(300 * US)  # ranked by device time
    assert top.host_time_s == pytest.approx(5 * US)
    text = render_report(report)
    assert "host vs device" in text and "device" in text.split("roofline of the top")[1].splitlines()[1]
    host_only = build_report(_hand_profile([(12.0, None)] * 3), Peaks(**PEAKS))
    assert host_only.host_device is None and "host vs device" not in render_report(host_only)


def test_calibrate_names_a_missing_accelerator_in_one_sentence() -> None:
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    run = subprocess.run([sys.executable, "-m", "graphprof", "calibrate", "--device", "cuda"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cannot calibrate device 'cuda'" in run.stderr and len(run.stderr.strip().splitlines()) == 1
