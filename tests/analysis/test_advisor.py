"""Advisor rules: a small program built to trigger each one is flagged at the right line; clean ones are not."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from graphprof.profile.records import seconds_to_ns
from graphprof.analysis.advisor import advise
from graphprof.analysis.roofline import Bound, Peaks, roofline
from graphprof.profile.model import GraphKind, GraphRecord, NodeRecord, Phase, Profile, StepRecord
from tests.analysis.conftest import one_graph_profile, traced_profile

# Peaks far above anything a CPU test reaches: every matmul counts as far below its roofline.
HUGE = {"flops_per_s": 1e15, "bytes_per_s": 1e13}
REAL = {"flops_per_s": 1e11, "bytes_per_s": 2e10}


def _rules(profile, peaks=None):
    # Shares of the fastest step and each node's fastest run: a loaded machine stretches steps with
    # gaps no node accounts for, which would move a share across a rule's threshold.
    return {f.rule: f for f in advise(profile, Peaks(**peaks) if peaks else None, stat="min")}


def _mlp_step(dtype=torch.float32, foreach=None, width=64, log_item=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 8)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=foreach)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)  # the line findings point at
        loss.backward()
        opt.step()
        if log_item:
            sys.stdout.write(f"loss {loss.item():.3f}\n")  # not print: the replay would format that
        return loss

    def inputs(i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(256, 32, generator=g).to(dtype), torch.randn(256, 8, generator=g).to(dtype)

    return step, inputs


def test_float64_work_is_flagged_at_the_model_line() -> None:
    step, inputs = _mlp_step(torch.float64)
    finding = _rules(traced_profile(step, inputs))["float64"]
    assert any("test_advisor.py" in s for s in finding.sources)
    clean_step, clean_inputs = _mlp_step(torch.float32)
    assert "float64" not in _rules(traced_profile(clean_step, clean_inputs))


def test_host_sync_from_item_logging() -> None:
    step, inputs = _mlp_step(log_item=True)
    finding = _rules(traced_profile(step, inputs))["host-sync"]
    assert any("test_advisor.py" in s for s in finding.sources)
    clean_step, clean_inputs = _mlp_step()
    assert "host-sync" not in _rules(traced_profile(clean_step, clean_inputs))


def test_single_tensor_optimizer_and_foreach_fix() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8) for _ in range(12)]
    model = nn.Sequential(*layers)
    for foreach, expected in ((False, True), (True, False)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)

        def step(x, opt=opt):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        profile = traced_profile(step, lambda i: (torch.randn(4, 8),))
        assert ("single-tensor-optimizer" in _rules(profile)) is expected


def test_layout_copies() -> None:
    def step(x):
        y = x.transpose(0, 1).contiguous()  # a layout copy: most of this step's time
        return y[:8].sum()

    finding = _rules(traced_profile(step, lambda i: (torch.randn(1024, 1024),)))["layout-copy"]
    assert any("test_advisor.py" in s for s in finding.sources)


def test_dispatch_bound_run_of_tiny_ops() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(30) for m in (nn.Linear(4, 4), nn.Tanh())])

    def step(x):
        with torch.no_grad():
            return model(x)

    profile = traced_profile(step, lambda i: (torch.randn(2, 4),))
    finding = _rules(profile, REAL)["dispatch-bound"]
    assert len(finding.nodes) >= 20


def test_slow_matmuls_need_peaks_and_flag_the_matmul() -> None:
    step, inputs = _mlp_step(width=512)
    profile = traced_profile(step, inputs)
    assert "slow-matmul" not in _rules(profile)  # no peaks: no roofline claims
    finding = _rules(profile, HUGE)["slow-matmul"]
    assert finding.sources


def test_slow_convolution_path_is_named(monkeypatch) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, padding=1)

    def step(x):
        with torch.no_grad():
            return conv(x)  # the convolution the finding must name

    inputs = lambda i: (torch.randn(16, 16, 32, 32),)  # noqa: E731
    assert "slow-conv" not in _rules(traced_profile(step, inputs))
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    finding = _rules(traced_profile(step, inputs))["slow-conv"]
    assert "convolution" in finding.title and any("test_advisor.py" in s for s in finding.sources)


def test_device_copies_from_a_hand_built_profile() -> None:
    # No accelerator here: the rule is checked on the records a GPU run produces.
    copy = NodeRecord(id=0, name="_to_copy", op="aten._to_copy.default", type="_to_copy", source="train.py:9",
                      phase=Phase.FORWARD, host_time_ns=seconds_to_ns((2e-4,)), attrs=(("devices", "cuda:0,cpu"),))
    same = NodeRecord(id=1, name="_to_copy_1", op="aten._to_copy.default", type="_to_copy", source="train.py:10",
                      phase=Phase.FORWARD, host_time_ns=seconds_to_ns((2e-4,)), attrs=(("devices", "cpu"),))
    rules = _rules(one_graph_profile([copy, same], walls_s=(1e-3,), first_step=2))
    assert rules["device-copy"].sources == ("train.py:9",)


def test_activation_peak_rule_from_memory_peak() -> None:
    from graphprof.profile.model import MemoryPeak

    node = NodeRecord(id=0, name="relu", op="aten.relu.default", type="relu", source="m.py:3",
                      phase=Phase.FORWARD, host_time_ns=seconds_to_ns((1e-4,)))
    peak_fields = dict(node_id=0, live_bytes=2**30, by_category_bytes={"activations": 900 * 2**20, "parameters": 124 * 2**20})
    peak = MemoryPeak(**{k: v for k, v in peak_fields.items() if k in MemoryPeak.__dataclass_fields__})
    graph = GraphRecord(id=0, name="step", kind=GraphKind.STEP, nodes=(node,), memory_peak=peak)
    profile = Profile(steps=(StepRecord(index=2, wall_time_s=1e-3),), graphs=(graph,))
    assert "activation-peak" in _rules(profile)


def test_roofline_bounds_on_hand_values() -> None:
    peaks = Peaks(flops_per_s=1e11, bytes_per_s=1e10)  # ridge at 10 FLOP/B
    mk = lambda i, flops, moved, t: NodeRecord(id=i, name=f"n{i}", op="aten.mm.default", type="mm",  # noqa: E731
                                               flops=flops, bytes_read=moved, bytes_written=0, host_time_ns=seconds_to_ns((t,)))
    nodes = [mk(0, 10**9, 10**6, 0.02), mk(1, 10**6, 10**8, 0.02), mk(2, 10, 10, 5e-6), mk(3, 10**8, 10**6, 0.5)]
    points = {p.node_id: p for p in roofline(one_graph_profile(nodes, walls_s=(1e-3,), first_step=2), peaks)}
    assert points[0].bound is Bound.COMPUTE and points[0].fraction_of_attainable == pytest.approx(0.5)
    assert points[1].bound is Bound.MEMORY and points[1].fraction_of_attainable == pytest.approx(0.5)
    assert points[2].bound is Bound.OVERHEAD
    assert points[3].bound is Bound.SLOW
    no_peaks = roofline(one_graph_profile(nodes, walls_s=(1e-3,), first_step=2), None)
    assert {p.bound for p in no_peaks} == {Bound.UNKNOWN}


def test_demo_steps_only_get_defensible_findings() -> None:
    from graphprof.demo.steps import gpt_adamw_step, resnet_sgd_step

    for demo in (resnet_sgd_step(batch_size=8, image_size=16), gpt_adamw_step(batch_size=2, seq_len=32)):
        profile = traced_profile(demo.step_fn, demo.make_inputs, peaks=REAL)
        rules = set(_rules(profile))
        # Real on CPU: single-tensor optimizer loops (foreach is off by default on CPU), layout copies
        # (the GPT's attention reshapes), tiny-op runs and below-roofline matmuls at these toy sizes.
        assert rules <= {"single-tensor-optimizer", "layout-copy", "dispatch-bound", "slow-matmul"}, rules
        assert not rules & {"float64", "host-sync", "device-copy", "slow-conv", "activation-peak"}
