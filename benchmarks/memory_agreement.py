"""Does the memory model agree with torch.profiler's memory events?

For each demo training step the memory pass's figures (bytes allocated in
the step, peak of live bytes above what was live before the step, and the
bytes the step leaves alive) are compared with an independent measurement:
torch.profiler with ``profile_memory=True`` on the CPU, whose allocator
reports every allocation and free with its address and the op it happened in.

Which run is comparable: the captured graph replayed (``graph_module(*inputs)``
under ``no_grad``, after dropping the previous gradients as the replay does),
because it runs exactly the aten ops, in the order, that the model describes.
The eager step is measured too, for reference: it is a different program
(autograd keeps its own saved tensors and gradient buffers, zero_grad frees
gradients inside the step) and is not expected to match.

The measured figures are also split into two parts, by pairing each free
with its allocation (same address): *kernel scratch*, memory a kernel
allocates and frees before it returns (oneDNN's reordered copies of inputs
and weights, a second output buffer), which is invisible at the graph level;
and *values*, everything that outlives the op that allocated it, which is
what the model describes.

The model includes the kernel workspace graphprof measures once, during the
first replayed step of a ``profiling=True`` trace (runtime/workspace.py):
bytes allocated = shape-based model + workspace allocated; peak = the largest
(live before a node + its allocations + its workspace peak). The measured
run below is a later, separate replay, so the comparison is not circular.

Usage: python -m benchmarks.memory_agreement [--workload resnet gpt]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

import graphprof
from graphprof.demo.steps import DEMO_STEPS
from graphprof.passes.memory import memory
from graphprof.passes.records import MEMORY, MEMORY_STEP, StepMemoryRecord


@dataclass(frozen=True)
class Measured:
    """Figures from torch.profiler's allocation events of one run (bytes)."""

    allocated_bytes: int
    peak_bytes: int  # high-water of (allocations - frees) since the run started
    net_bytes: int  # left allocated when the run ends
    values_allocated_bytes: int  # without kernel scratch
    values_peak_bytes: int
    scratch_bytes: int
    scratch_by_op: dict[str, int]


def _allocations(prof: profile) -> list[tuple[int, int, int, str]]:
    """(time, signed bytes, address, top-level op or '') of every CPU allocation event."""
    out: list[tuple[int, int, int, str]] = []

    def walk(node, top: str, top_id: int) -> None:  # type: ignore[no-untyped-def]
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                out.append((node.start_time_ns, f.alloc_size, f.ptr, f"{top}#{top_id}" if top else ""))
            return
        for child in node.children:
            walk(child, top, top_id)

    for i, root in enumerate(prof.profiler.kineto_results.experimental_event_tree()):
        if root.tag == _EventType.Allocation:
            walk(root, "", -1)
        else:
            for child in [root]:
                walk(child, root.name, i)
    out.sort(key=lambda e: e[0])
    return out


def measure_run(run: Callable[[], object]) -> Measured:
    """Profile ``run()`` with memory events and summarise them."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    del result
    events = _allocations(prof)
    # pair frees with allocations: same address, freed inside the same top-level op = scratch
    open_allocs: dict[int, tuple[int, str]] = {}
    scratch_index: set[int] = set()
    for i, (_, nbytes, ptr, op) in enumerate(events):
        if nbytes > 0:
            open_allocs[ptr] = (i, op)
        elif ptr in open_allocs:
            j, alloc_op = open_allocs.pop(ptr)
            if op and op == alloc_op:
                scratch_index.update((i, j))
    total = peak = values_total = values_peak = 0
    allocated = values_allocated = 0
    scratch_by_op: dict[str, int] = {}
    for i, (_, nbytes, _, op) in enumerate(events):
        total += nbytes
        peak = max(peak, total)
        allocated += max(nbytes, 0)
        if i in scratch_index:
            if nbytes > 0:
                name = op.split("#")[0]
                scratch_by_op[name] = scratch_by_op.get(name, 0) + nbytes
            continue
        values_total += nbytes
        values_peak = max(values_peak, values_total)
        values_allocated += max(nbytes, 0)
    return Measured(allocated, peak, total, values_allocated, values_peak,
                    sum(scratch_by_op.values()), scratch_by_op)


def _modelled(fn) -> StepMemoryRecord:  # type: ignore[no-untyped-def]
    output = next(n for n in fn.graph_module.graph.nodes if n.op == "output")
    return output.meta[MEMORY_STEP]


def _modelled_without_workspace(gm) -> StepMemoryRecord:  # type: ignore[no-untyped-def]
    """The shape-based model alone: the pass run without workspace, then the traced records put back."""
    saved = {n: n.meta.get(MEMORY) for n in gm.graph.nodes}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    saved_step = output.meta[MEMORY_STEP]
    memory(gm)
    shapes_only = output.meta[MEMORY_STEP]
    for n, m in saved.items():  # put the workspace-aware records back
        if m is not None:
            n.meta[MEMORY] = m
    output.meta[MEMORY_STEP] = saved_step
    return shapes_only


def _pct(model: int, measured: int) -> str:
    return f"{100.0 * (model - measured) / measured:+.2f}%" if measured else "n/a"


def compare(workload: str) -> dict[str, object]:
    demo = DEMO_STEPS[workload](seed=0)
    fn = graphprof.trace(demo.step_fn, profiling=True)
    for i in range(3):  # eager, capture, one replay (which measures kernel workspace)
        fn(*demo.make_inputs(i))
    model = _modelled(fn)
    gm = fn.graph_module
    workspace = fn.runner.workspace or {}  # measured during the first replay; {} if it could not be attributed
    shapes_only = _modelled_without_workspace(gm)
    inputs = demo.make_inputs(3)

    def replay() -> object:
        with torch.no_grad():
            return gm(*inputs)

    demo.optimizer.zero_grad(set_to_none=True)  # the replay drops last step's gradients before the graph
    graph_run = measure_run(replay)
    demo.optimizer.zero_grad(set_to_none=True)
    eager_run = measure_run(lambda: demo.step_fn(*inputs))
    return {"workload": workload, "model": model, "graph": graph_run, "eager": eager_run,
            "shapes_only": shapes_only, "workspace_bytes": sum(w.allocated_bytes for w in workspace.values()),
            "workspace_nodes": len(workspace),
            "nodes": sum(1 for n in gm.graph.nodes if n.op == "call_function")}


def _report(r: dict[str, object]) -> str:
    model: StepMemoryRecord = r["model"]  # type: ignore[assignment]
    g: Measured = r["graph"]  # type: ignore[assignment]
    e: Measured = r["eager"]  # type: ignore[assignment]
    shapes: StepMemoryRecord = r["shapes_only"]  # type: ignore[assignment]
    peak_above_start = model.peak_bytes - model.start_bytes
    shapes_peak = shapes.peak_bytes - shapes.start_bytes
    left = model.end_bytes - model.start_bytes
    lines = [
        f"== {r['workload']} ({r['nodes']} op nodes; live before the step, modelled: {model.start_bytes:,} B)",
        f"{'':34}{'model':>14}{'graph replay':>16}{'diff':>10}{'eager':>16}",
        f"{'allocated in the step':34}{model.allocated_bytes:>14,}{g.allocated_bytes:>16,}"
        f"{_pct(model.allocated_bytes, g.allocated_bytes):>10}{e.allocated_bytes:>16,}",
        f"{'peak live above the start':34}{peak_above_start:>14,}{g.peak_bytes:>16,}"
        f"{_pct(peak_above_start, g.peak_bytes):>10}{e.peak_bytes:>16,}",
        f"{'peak live, absolute':34}{model.peak_bytes:>14,}{model.start_bytes + g.peak_bytes:>16,}"
        f"{_pct(model.peak_bytes, model.start_bytes + g.peak_bytes):>10}{model.start_bytes + e.peak_bytes:>16,}",
        f"{'left alive by the step':34}{left:>14,}{g.net_bytes:>16,}{_pct(left, g.net_bytes):>10}{e.net_bytes:>16,}",
        f"  model includes {r['workspace_bytes']:,} B of measured kernel workspace on {r['workspace_nodes']} nodes",
        f"{'  shapes only vs replay without kernel scratch:':34}",
        f"{'  allocated (values only)':34}{shapes.allocated_bytes:>14,}{g.values_allocated_bytes:>16,}"
        f"{_pct(shapes.allocated_bytes, g.values_allocated_bytes):>10}",
        f"{'  peak above start (values only)':34}{shapes_peak:>14,}{g.values_peak_bytes:>16,}"
        f"{_pct(shapes_peak, g.values_peak_bytes):>10}",
        f"  kernel scratch in the replay: {g.scratch_bytes:,} B, by op: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(g.scratch_by_op.items(), key=lambda kv: -kv[1])[:6]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt"], choices=sorted(DEMO_STEPS))
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    for workload in args.workload:
        print(_report(compare(workload)))


if __name__ == "__main__":
    main()
