"""Per-op-type agreement of graphprof's node times with torch.profiler's.

Like is compared with like: both measure the *same* captured graph running
the same aten ops. graphprof times it with its probes; torch.profiler
(CPU activity only, no shapes/memory/FLOPs, so as light as it gets) records
the plain graph's runs. For torch.profiler, an op type's time is the total
CPU time of its top-level events (those not nested in another aten op), per
step.

torch.profiler's own overhead is counted out: it adds a roughly constant
cost per recorded event, including every nested child event an op's kernel
dispatches. That cost is measured first (a childless op, aten.alias, run in a
loop with and without the profiler), and each top-level event's time is
reduced by it once per event in its subtree.

Usage: python -m benchmarks.agreement [--workload resnet gpt] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

import graphprof
from graphprof.demo.steps import DEMO_STEPS


@dataclass(frozen=True)
class TypeAgreement:
    op_type: str
    graphprof_s: float
    torch_profiler_s: float

    @property
    def ratio(self) -> float:
        return self.graphprof_s / self.torch_profiler_s if self.torch_profiler_s > 0 else float("inf")


def profiler_overhead_per_event_s(n: int = 20000) -> float:
    """Extra wall time per recorded event: a childless op with and without the profiler."""
    x = torch.randn(4)
    op = torch.ops.aten.alias.default
    for _ in range(1000):
        op(x)
    t0 = time.perf_counter()
    for _ in range(n):
        op(x)
    plain = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU]):
        t0 = time.perf_counter()
        for _ in range(n):
            op(x)
        profiled = time.perf_counter() - t0
    return max(0.0, (profiled - plain) / n)


def _subtree_size(event) -> int:
    return 1 + sum(_subtree_size(c) for c in event.cpu_children)


def measure(workload: str, steps: int = 10, top: int = 5) -> tuple[list[TypeAgreement], float]:
    demo = DEMO_STEPS[workload](seed=0)
    inputs = demo.make_inputs(0)
    fn = graphprof.trace(demo.step_fn)
    for _ in range(2 + steps):
        fn(*inputs)
    ours: dict[str, list[float]] = defaultdict(lambda: [0.0] * steps)
    profile_data = fn.get_profile()
    for _, node in profile_data.iter_nodes():
        for i, t in enumerate(node.host_time_s[-steps:]):
            ours[node.type][i] += t
    graphprof_by_type = {k: statistics.median(v) for k, v in ours.items()}

    overhead = profiler_overhead_per_event_s()
    fn.profiling = False
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn(*inputs)
    theirs: dict[str, float] = defaultdict(float)
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent is not None and parent.name.startswith("aten::")):
            continue
        corrected_us = event.cpu_time_total - overhead * 1e6 * _subtree_size(event)
        theirs[event.name.removeprefix("aten::")] += corrected_us * 1e-6 / steps
    top_types = sorted(graphprof_by_type, key=graphprof_by_type.get, reverse=True)[:top]
    return [TypeAgreement(t, graphprof_by_type[t], theirs.get(t, 0.0)) for t in top_types], overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt"], choices=sorted(DEMO_STEPS))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print("| workload | op type | graphprof | torch.profiler (overhead counted out) | ratio |\n|---|---|---|---|---|")
    for workload in args.workload:
        rows, overhead = measure(workload, args.steps)
        for r in rows:
            print(f"| {workload} | {r.op_type} | {r.graphprof_s * 1e6:.0f} us | {r.torch_profiler_s * 1e6:.0f} us | "
                  f"{r.ratio:.3f} |")
    print(f"\ntorch.profiler overhead per recorded event: {overhead * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
