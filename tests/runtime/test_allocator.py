"""Allocator sampling every ``sample_rate`` ops: where reads go, and real reads on an accelerator."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import graphprof
from graphprof.passes.annotate import annotate, is_op_node
from graphprof.passes.instrument import instrument
from graphprof.passes.records import ANNOTATION
from graphprof.runtime.allocator import AllocatorSampler, add_allocator_samples, sampled_nodes


class _RecordingSampler(AllocatorSampler):
    """Records which nodes it is called after, without an accelerator."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__(sample_rate)
        self.calls: list[int] = []

    def read(self, node_id: int) -> None:
        self.calls.append(node_id)


def test_sampled_nodes_every_nth_and_the_last() -> None:
    assert sampled_nodes(list(range(10)), 3) == [2, 5, 8, 9]
    assert sampled_nodes(list(range(9)), 3) == [2, 5, 8]
    assert sampled_nodes(list(range(2)), 5) == [1]
    assert sampled_nodes([], 4) == []
    with pytest.raises(ValueError):
        AllocatorSampler(0)


def test_reads_sit_after_every_nth_op_outputs_unchanged() -> None:
    x = torch.randn(4, 8)
    gm = annotate(make_fx(lambda x: ((x * 2).relu() @ x.t()).softmax(-1).sum(), tracing_mode="real")(x))
    ops = [n.meta[ANNOTATION].index for n in gm.graph.nodes if is_op_node(n)]
    expected_out = gm(x)
    instrumented = instrument(gm)
    plain_out, stamps = instrumented(x)
    sampler = _RecordingSampler(2)
    add_allocator_samples(instrumented, sampler)
    out, stamps_after = instrumented(x)
    assert sampler.calls == [ops[i] for i in sampled_nodes(ops, 2)]
    assert torch.equal(out, expected_out) and torch.equal(plain_out, expected_out)
    assert len(stamps_after) == len(stamps)  # probes untouched


def test_sample_rate_is_validated_and_cpu_graphs_get_no_reads() -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        graphprof.trace(lambda x: x, sample_rate=-1)
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    fn = graphprof.trace(step, sample_rate=2)
    for _ in range(4):
        fn(torch.randn(3, 4))
    assert fn.get_profile().graphs[0].device_memory == ()  # the graph runs on the CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.accelerator.is_available(), reason="needs an accelerator")
def test_allocator_reads_on_an_accelerator_next_to_the_model() -> None:
    device = torch.accelerator.current_accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fn = graphprof.trace(step, sample_rate=4)
    for _ in range(5):
        fn(torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device))
    profile = fn.get_profile()
    graph = profile.graphs[0]
    ids = [n.id for n in graph.nodes]
    expected = [ids[i] for i in sampled_nodes(ids, 4)]
    steps = [s.index for s in profile.steps]
    assert [s.step for s in graph.device_memory] == [st for st in steps for _ in expected]
    assert [s.node_id for s in graph.device_memory] == expected * len(steps)
    for s in graph.device_memory:
        assert 0 < s.allocated_bytes <= s.peak_bytes <= s.reserved_bytes
    # the allocator holds at least what the model says is live (it rounds blocks up, and
    # holds library workspaces the model does not know about)
    live = {n.id: n.memory.live_bytes for n in graph.nodes}
    for s in graph.device_memory:
        assert s.allocated_bytes >= live[s.node_id]
    assert max(s.peak_bytes for s in graph.device_memory) >= graph.memory_peak.live_bytes
    assert "allocator reads" in profile.memory_summary()
