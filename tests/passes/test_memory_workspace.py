"""Kernel workspace: measured inside the capture call, on copies, without changing results.

oneDNN convolutions and batch norms allocate scratch inside one call; the
capture call of a ``profiling=True`` trace measures it with torch.profiler
on copies of the step's state, and the memory figures include it. The checks here compare
with an independent torch.profiler run of the same graph, and with eager.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import graphprof
from graphprof.analysis.memory import memory_summary, memory_timeline
from graphprof.demo.steps import resnet_sgd_step
from graphprof.runtime.workspace import Workspace, transient
from tests.helpers import assert_same_state, run_eager, run_traced

STEPS = 5


def _ops_with_scratch(prof: profile) -> Counter[str]:
    """Top-level aten ops in which an allocation was freed before the op returned, counted by name."""
    from torch._C._profiler import _EventType

    seen: Counter[str] = Counter()
    for root in prof.profiler.kineto_results.experimental_event_tree():
        if root.tag != _EventType.TorchOp:
            continue
        allocated: set[int] = set()
        stack, scratch = [root], False
        events = []
        while stack:
            node = stack.pop()
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr))
            stack.extend(node.children)
        for _, nbytes, ptr in sorted(events):
            if nbytes > 0:
                allocated.add(ptr)
            elif ptr in allocated:
                scratch = True
        if scratch:
            seen[root.name] += 1
    return seen


@pytest.fixture(scope="module")
def traced() -> tuple[object, object, graphprof.Profile]:
    eager_demo, traced_demo = resnet_sgd_step(batch_size=2, image_size=16), resnet_sgd_step(batch_size=2, image_size=16)
    eager = run_eager(eager_demo, STEPS)
    results, fn = run_traced(traced_demo, STEPS, profiling=True)
    for i, (a, b) in enumerate(zip(eager, results)):
        assert torch.equal(a, b), f"step {i}: traced loss differs from eager"
    assert_same_state(eager_demo, traced_demo)
    return traced_demo, fn, fn.get_profile()


def test_results_stay_bitwise_equal_and_no_call_is_spent_measuring(traced) -> None:
    _, _, prof = traced
    # call 0 eager, call 1 captures and measures the workspace: calls 2, 3 and 4 are profiled steps
    assert [s.index for s in prof.steps] == [2, 3, 4]
    assert prof.meta.extra["workspace"] == "measured"


def test_nodes_carry_the_workspace_torch_profiler_sees(traced) -> None:
    demo, fn, prof = traced
    gm = fn.graph_module
    inputs = demo.make_inputs(STEPS)
    demo.optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p, torch.no_grad():
        gm(*inputs)
    expected = _ops_with_scratch(p)
    assert expected["aten::convolution"] > 0  # oneDNN really does allocate scratch here
    graph = prof.graphs[0]
    name_of = {n.name: n.target._schema.name for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)}
    with_workspace = [n for n in graph.nodes if n.memory is not None and n.memory.workspace_allocated_bytes]
    assert Counter(name_of[n.name] for n in with_workspace) == expected
    assert all(0 < n.memory.workspace_bytes <= n.memory.workspace_allocated_bytes for n in with_workspace)


def test_step_figures_include_the_workspace(traced) -> None:
    _, _, prof = traced
    graph = prof.graphs[0]
    nodes = [n for n in graph.nodes if n.memory is not None]
    peak = graph.memory_peak
    modelled = sum(n.memory.allocated_bytes for n in nodes)
    workspace = sum(n.memory.workspace_allocated_bytes for n in nodes)
    assert workspace > 0 and peak.allocated_bytes == modelled + workspace
    high_water = [n.memory.live_bytes + n.memory.freed_bytes + n.memory.workspace_bytes for n in nodes]
    assert peak.live_bytes == max(high_water)
    at_peak = next(n for n in nodes if n.id == peak.node_id)
    assert peak.by_category_bytes.get("workspace", 0) == at_peak.memory.workspace_bytes
    timeline = memory_timeline(prof)
    assert max(timeline.during_bytes) == timeline.peak_bytes == peak.live_bytes
    assert memory_summary(prof).allocated_bytes == modelled + workspace


def test_workspace_survives_save_and_load(traced, tmp_path) -> None:
    _, _, prof = traced
    path = tmp_path / "p.json"
    prof.save(str(path))
    loaded = graphprof.load(path)
    assert loaded == prof
    assert any(n.memory.workspace_bytes for n in loaded.graphs[0].nodes if n.memory is not None)


def test_transient_counts_only_allocations_freed_inside_the_op() -> None:
    # (time, signed bytes, address): A=100 and B=50 overlap, C=30 after A is freed, D=10 is the op's output
    events = [(0, 100, 1), (1, 50, 2), (2, -100, 1), (3, 30, 3), (4, -50, 2), (5, -30, 3), (6, 10, 4)]
    assert transient(events) == Workspace(peak_bytes=150, allocated_bytes=180)
    assert transient([(0, 64, 1)]) == Workspace(0, 0)


_FRESH_PROCESS_STEP = """
import os, torch, graphprof
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

@graphprof.trace(profiling=True)
def step(x):
    opt.zero_grad()
    loss = model(x).sum()
    loss.backward()
    opt.step()
    return loss

for i in range(3):
    step(torch.randn(3, 4))
assert step.get_profile().meta.extra["workspace"] == "measured"
print("KINETO_LOG_LEVEL" in os.environ, os.getenv("KINETO_LOG_LEVEL"))
"""


def test_measuring_prints_nothing_on_stderr_and_leaves_the_environment_alone() -> None:
    """Kineto prints its profiler start and stop lines on stderr unless its level is set before its first
    start: a fresh process (the level is read once per process) captures with nothing printed."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_STEP], capture_output=True, text=True, env=env,
                          check=True)
    assert proc.stderr == ""
    assert proc.stdout.split() == ["False", "None"]
