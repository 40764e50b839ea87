"""The instrument pass: host-clock probes around every op node.

A probe is one call of the host clock (``time.perf_counter_ns`` by default,
about 50 ns) placed before the first op and after every op. The stamps are
plain local values of the generated code and leave the graph as one extra
output tuple, so a probe writes to no buffer, allocates nothing on the
device and keeps the graph reentrant. The time of op ``i`` in a step is
``stamps[i + 1] - stamps[i]``: everything the host did for that node,
including the previous probe's own cost (``probe_cost_ns`` measures it).

Probes are the only change to the executed graph: op nodes, their order and
their arguments are copied unchanged.
"""

from __future__ import annotations

import inspect
import time
from typing import Callable

import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.graph_modules import graph_module
from graphprof.passes.records import PROBE, PROBE_AFTER, ProbeRecord

Clock = Callable[[], int]


def instrument(gm: torch.fx.GraphModule, clock: Clock = time.perf_counter_ns) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose output becomes ``(original_output, stamps)``.

    ``stamps`` has one entry more than ``gm`` has op nodes. The copy shares
    ``gm``'s attributes (the user's parameters and state), not copies of them.
    Each op node of ``gm`` gets the ProbeRecord of the probe after it under
    ``PROBE_AFTER``: its time in a step is ``stamps[slot] - stamps[slot - 1]``.
    """
    clock = _as_function(clock)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    stamps: list[torch.fx.Node] = []

    def probe(after: str) -> ProbeRecord:
        node = graph.call_function(clock, ())
        record = node.meta[PROBE] = ProbeRecord(slot=len(stamps), after=after)
        stamps.append(node)
        return record

    started = False
    for node in gm.graph.nodes:
        if node.op == "output":
            if not started:
                probe("")
            original = torch.fx.map_arg(node.args[0], lambda n: env[n])
            graph.output((original, tuple(stamps)))
            continue
        if is_op_node(node) and not started:
            probe("")
            started = True
        env[node] = graph.node_copy(node, lambda n: env[n])
        if is_op_node(node):
            node.meta[PROBE_AFTER] = probe(node.name)
    return graph_module(gm, graph, class_name="InstrumentedStep")


def _as_function(clock: Clock) -> Clock:
    """fx can call functions and builtins by name; wrap other callables (fake clocks)."""
    if inspect.isfunction(clock) or inspect.isbuiltin(clock):
        return clock
    inner = clock

    def clock_reading() -> int:
        return inner()

    return clock_reading


def probe_cost_ns(clock: Clock = time.perf_counter_ns, samples: int = 2000) -> float:
    """Median cost of one probe (a clock call inside generated code), in ns."""
    graph = torch.fx.Graph()
    nodes = [graph.call_function(clock, ()) for _ in range(100)]
    graph.output(tuple(nodes))
    fn = torch.fx.GraphModule(torch.nn.Module(), graph)
    costs = []
    for _ in range(samples // 100):
        stamps = fn()
        costs.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    costs.sort()
    return float(costs[len(costs) // 2])
