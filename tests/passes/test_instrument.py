"""The instrument pass: probes with a fake clock, graph otherwise unchanged."""

from __future__ import annotations

import itertools

import torch

from graphprof.capture.captured_step import run_captured
from graphprof.capture.whole_step import capture_whole_step
from graphprof.passes.annotate import annotate, is_op_node
from graphprof.passes.instrument import instrument, probe_cost_ns
from graphprof.passes.records import PROBE
from graphprof.runtime.collect import graph_record
from graphprof.runtime.samples import StepSamples

_TICKS = itertools.count(0, 1000)


def fake_clock() -> int:
    """A clock that advances 1000 ns per reading."""
    return next(_TICKS)


def _captured():
    w = torch.ones(3)

    def f(x):
        return (x * w).relu().sum()

    x = torch.arange(3.0)
    return capture_whole_step(f, (x,), {}), x


def test_probes_surround_every_op_and_outputs_unchanged() -> None:
    captured, x = _captured()
    gm = annotate(captured.graph_module)
    inst = instrument(gm, fake_clock)
    ops = [n for n in gm.graph.nodes if is_op_node(n)]
    probes = [n for n in inst.graph.nodes if PROBE in n.meta]
    assert len(probes) == len(ops) + 1
    # the op nodes and their order are unchanged
    inst_ops = [n.target for n in inst.graph.nodes if is_op_node(n) and PROBE not in n.meta]
    assert inst_ops == [n.target for n in ops]
    plain = run_captured(captured, gm, [x])[0]
    result, stamps, _ = run_captured(captured, inst, [x], instrumented=True)
    assert torch.equal(plain, result)
    assert len(stamps) == len(ops) + 1
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [1000] * len(ops)


def test_node_times_come_from_consecutive_stamps() -> None:
    captured, _ = _captured()
    gm = annotate(captured.graph_module)
    n_ops = sum(1 for n in gm.graph.nodes if is_op_node(n))
    stamps = tuple(sum(range(i + 1)) * 10 for i in range(n_ops + 1))  # gaps 10, 20, 30...
    record = graph_record(gm, [StepSamples(index=2, wall_ns=10**6, stamps_ns=stamps)])
    assert [n.host_time_s for n in record.nodes] == [((i + 1) * 10 / 1e9,) for i in range(n_ops)]


def test_probe_is_cheap() -> None:
    assert 0 < probe_cost_ns() < 1000  # "well under a microsecond" (typically ~50 ns)
