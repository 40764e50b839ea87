"""On a real accelerator: device times of a training step, one sync per step, overhead, agreement.

Every test here is marked ``gpu`` and skipped without a torch.accelerator
device. They ran on an NVIDIA H100 (torch 2.11, CUDA 13) on 2026-11-23 and on an
H200 on 2026-11-28. A bound on the pipelined overhead (1.25) that an earlier
version asserted failed at 1.254 on the H100 and at 1.347 on the H200: a
timing, which the benchmark reports rather than a test.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

import graphprof
from graphprof.analysis.advisor import advise
from tests.gpu import ON_AN_ACCELERATOR, accelerator

pytestmark = ON_AN_ACCELERATOR


def _mlp(width: int = 1024, depth: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(accelerator())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def inputs(i: int, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(batch, width, generator=g)
        return x.to(accelerator()), torch.randint(0, 10, (batch,), generator=g).to(accelerator())

    return model, step, inputs


def test_training_step_on_the_device_has_device_times_outputs_unchanged() -> None:
    model, step, inputs = _mlp()
    fn = graphprof.trace(step)
    losses = [fn(*inputs(i)) for i in range(6)]
    eager_model, eager_step, _ = _mlp()
    eager = [eager_step(*inputs(i)) for i in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(losses, eager))  # profiling never changes results
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager_model.parameters()))
    profile = fn.get_profile()
    meta = profile.meta
    assert meta.device_type == accelerator().type and meta.device_name not in ("", accelerator().type)
    assert meta.device is not None and meta.device.timing == "pipelined" and meta.device.device.startswith(accelerator().type)
    step_graph = profile.graphs[0]
    assert all(len(n.device_time_s) == len(profile.steps) for n in step_graph.nodes)
    assert all(t >= 0 for n in step_graph.nodes for t in n.device_time_s)
    for k, record in enumerate(profile.steps):
        # pipelined spans are consecutive: they add up to first-to-last event, inside the step's wall time
        device_s = sum(n.device_time_s[k] for n in step_graph.nodes)
        assert 0 < device_s <= record.wall_time_s * 1.01
    mm = [n for n in step_graph.nodes if n.type in ("addmm", "mm")]
    assert mm and all(statistics.median(n.device_time_s) > 0 for n in mm)


def _counting_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = torch.accelerator.synchronize

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.accelerator, "synchronize", counted)
    return calls


@pytest.mark.parametrize("timing", ["pipelined", "isolated"])
def test_synchronisations_per_step(monkeypatch: pytest.MonkeyPatch, timing: str) -> None:
    _, step, inputs = _mlp(width=256)
    fn = graphprof.trace(step, timing=timing)
    fn(*inputs(0))
    fn(*inputs(1))  # capture (and the clock's one-off mark-cost measurement)
    calls = _counting_syncs(monkeypatch)
    for i in range(4):
        fn(*inputs(2 + i))
    nodes = len(fn.get_profile().graphs[0].nodes)
    assert calls[0] == (4 if timing == "pipelined" else 4 * (nodes + 1))
    device = fn.get_profile().meta.device
    assert device is not None and device.timing == timing


def test_pipelined_timing_costs_less_than_a_synchronisation_after_every_op() -> None:
    """The overhead measurement runs all three variants; pipelined events (enqueued, one sync per step)
    cost less than isolated timing's sync per op. How much each costs is the benchmark's figure
    (``python -m benchmarks.device_agreement``), not a test's: it moves with the machine."""
    from benchmarks.device_agreement import measure_overhead

    result = measure_overhead("resnet", rounds=5, steps_per_round=3)
    assert result.nodes > 0 and result.plain_ms > 0
    assert result.sync_per_step < result.isolated and result.pipelined < result.isolated, result


def test_per_op_device_times_agree_with_torch_profiler_kernel_times() -> None:
    from benchmarks.device_agreement import measure_agreement

    pairs = measure_agreement("resnet", steps=5, timing="pipelined", min_s=50e-6)
    assert pairs, "no op above 50 us"
    ratios = [p.ratio for p in pairs]
    # A pipelined node's device time is its kernels plus any wait for the host to launch them: never
    # much less than the profiler's kernel time, and more by as much as the host lags. The median
    # was 1.03 to 1.05 on an idle H200 and 1.17 on a busier one (2026-11-28): the figure is the
    # benchmark's (``python -m benchmarks.device_agreement``); the test holds the bounds a wrong
    # pairing or a lost event would break.
    assert statistics.median(ratios) >= 0.95 and min(ratios) >= 0.8, ratios
    assert statistics.median(ratios) <= 1.5, ratios


def test_tiny_ops_are_launch_bound_and_big_matmuls_are_not() -> None:
    from graphprof.demo.steps import tiny_op_mlp_step

    demo = tiny_op_mlp_step()
    demo.model.to(accelerator())
    x, y = (t.to(accelerator()) for t in demo.make_inputs(0))
    fn = graphprof.trace(demo.step_fn)
    for _ in range(6):
        fn(x, y)
    assert "launch-bound" in {f.rule for f in advise(fn.get_profile())}
    _, step, inputs = _mlp(width=4096, depth=2)
    big = graphprof.trace(step)
    for i in range(5):
        big(*inputs(i, batch=4096))
    assert "launch-bound" not in {f.rule for f in advise(big.get_profile())}


def test_calibrate_on_the_device_feeds_the_profile_meta() -> None:
    from graphprof.runtime.calibrate import calibrate, load_cached

    kind = accelerator().type
    peaks = calibrate(kind, matmul_n=2048, copy_mib=64, repeats=2)
    assert peaks["flops_per_s"] > 0 and peaks["bytes_per_s"] > 0
    assert load_cached(kind) == peaks
    _, step, inputs = _mlp(width=128)
    fn = graphprof.trace(step)
    for i in range(3):
        fn(*inputs(i))
    assert dict(fn.get_profile().meta.peaks) == peaks
