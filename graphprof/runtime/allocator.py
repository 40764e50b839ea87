"""Accelerator allocator statistics, sampled every ``sample_rate`` ops.

The memory pass models what a step allocates; on an accelerator the caching
allocator can also say what it holds. Reading it after every op would cost
microseconds per op (far more than a timing probe), so, as MegEngine's
profiler does, it is read after every ``sample_rate``-th op node and after
the last one. Each read records the bytes allocated now, the high-water mark
since the previous read (the peak counter is reset after every read, so a
transient inside the window is not missed) and the bytes reserved.

Everything goes through ``torch.accelerator``, so CUDA, ROCm, XPU and other
backends share one path. On a CPU-only machine nothing is inserted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

import torch
import torch.fx

from graphprof.passes.annotate import is_op_node
from graphprof.passes.records import ANNOTATION, PROBE
from graphprof.profile.model import DeviceMemorySample

#: Steps of samples kept at most; older ones are dropped (the sample buffer keeps fewer).
_MAX_STEPS_KEPT = 10_000


def accelerator_type() -> str | None:
    """The accelerator's device type ("cuda", "xpu", ...), or None without one."""
    if not torch.accelerator.is_available():
        return None
    device = torch.accelerator.current_accelerator()
    return device.type if device is not None else None


def node_device_types(node: torch.fx.Node) -> set[str]:
    """Device types of the tensors an annotated op node makes (none before annotation)."""
    ann = node.meta.get(ANNOTATION)
    return set() if ann is None else {t.device.split(":")[0] for t in ann.out_tensors if t is not None}


def graph_device_types(gm: torch.fx.GraphModule) -> set[str]:
    """Device types of the tensors a graph's op nodes make."""
    types: set[str] = set()
    for node in gm.graph.nodes:
        types |= node_device_types(node)
    return types


class AllocatorSampler:
    """Reads the accelerator allocator after chosen op nodes of an instrumented graph."""

    def __init__(self, sample_rate: int) -> None:
        if sample_rate < 1:
            raise ValueError("sample_rate must be at least 1")
        self.sample_rate = sample_rate
        self._pending: list[tuple[int, int, int, int]] = []
        self._steps: OrderedDict[int, tuple[tuple[int, int, int, int], ...]] = OrderedDict()

    def begin_step(self) -> None:
        """Start a graph run: drop unfinished reads, restart the high-water mark."""
        self._pending = []
        torch.accelerator.reset_peak_memory_stats()

    def read(self, node_id: int) -> None:
        """Record the allocator after op node ``node_id`` (called from the graph)."""
        self._pending.append((
            node_id,
            int(torch.accelerator.memory_allocated()),
            int(torch.accelerator.max_memory_allocated()),
            int(torch.accelerator.memory_reserved()),
        ))
        torch.accelerator.reset_peak_memory_stats()

    def end_step(self, step: int) -> None:
        """Keep the reads of the run just finished as profiled step ``step``."""
        self._steps[step] = tuple(self._pending)
        self._pending = []
        while len(self._steps) > _MAX_STEPS_KEPT:
            self._steps.popitem(last=False)

    def clear(self) -> None:
        self._steps.clear()
        self._pending = []

    def samples(self, steps: Iterable[int]) -> tuple[DeviceMemorySample, ...]:
        """The reads of the given profiled steps, in step order then node order."""
        out: list[DeviceMemorySample] = []
        for step in steps:
            for node_id, allocated, peak, reserved in self._steps.get(step, ()):
                out.append(DeviceMemorySample(step, node_id, allocated, peak, reserved))
        return tuple(out)


def sampled_nodes(op_ids: Sequence[int], sample_rate: int) -> list[int]:
    """Positions (into ``op_ids``) read by the sampler: every ``sample_rate``-th op and the last."""
    if not op_ids:
        return []
    picks = list(range(sample_rate - 1, len(op_ids), sample_rate))
    if picks[-1:] != [len(op_ids) - 1]:
        picks.append(len(op_ids) - 1)
    return picks


def add_allocator_samples(gm: torch.fx.GraphModule, sampler: AllocatorSampler) -> torch.fx.GraphModule:
    """Insert ``sampler.read(node_id)`` after every ``sample_rate``-th op node of ``gm``, in place.

    ``gm`` is an instrumented graph (the reads sit between an op and its
    timing probe, so their cost shows in that op's host time, never in the
    device time). Op nodes are the annotated ones; probes are skipped.
    """
    ops = [n for n in gm.graph.nodes if is_op_node(n) and PROBE not in n.meta and ANNOTATION in n.meta]
    for pos in sampled_nodes([n.meta[ANNOTATION].index for n in ops], sampler.sample_rate):
        node = ops[pos]
        with gm.graph.inserting_after(node):
            gm.graph.call_function(sampler.read, (node.meta[ANNOTATION].index,))
    gm.graph.lint()
    gm.recompile()
    return gm
