"""Capture cost: graphprof's capture call against torch.compile(backend="aot_eager").

graphprof's capture is call 2 of a traced function: make_fx runs the step
once while recording it, then the annotate, cost, memory and op_attrs passes
and the instrument pass run. torch.compile's cost is its first call with the
aot_eager backend (dynamo + AOTAutograd, no code generation), the cheapest
torch.compile that still builds forward and backward graphs. Both are
measured on fresh copies of the same step and input, in the same process,
minus one eager step (each first call also executes the step once).

Usage: python -m benchmarks.capture_cost [--workload resnet gpt tiny-mlp] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch._dynamo

import graphprof
from graphprof.demo.steps import DEMO_STEPS


@dataclass(frozen=True)
class CaptureCost:
    workload: str
    graphprof_s: float
    aot_eager_s: float

    @property
    def ratio(self) -> float:
        return self.graphprof_s / self.aot_eager_s


def _eager_step_s(workload: str) -> float:
    demo = DEMO_STEPS[workload](seed=0)
    inputs = demo.make_inputs(0)
    demo.step_fn(*inputs)
    t0 = time.perf_counter()
    demo.step_fn(*inputs)
    return time.perf_counter() - t0


def _graphprof_capture_s(workload: str) -> float:
    demo = DEMO_STEPS[workload](seed=0)
    inputs = demo.make_inputs(0)
    fn = graphprof.trace(demo.step_fn)
    fn(*inputs)  # call 1: eager
    t0 = time.perf_counter()
    fn(*inputs)  # call 2: capture + passes + instrument
    return time.perf_counter() - t0


def _aot_eager_compile_s(workload: str) -> float:
    torch._dynamo.reset()
    demo = DEMO_STEPS[workload](seed=0)
    inputs = demo.make_inputs(0)
    demo.step_fn(*inputs)  # same state as graphprof's capture call: optimizer moments exist
    compiled = torch.compile(demo.step_fn, backend="aot_eager")
    t0 = time.perf_counter()
    compiled(*inputs)
    return time.perf_counter() - t0


def measure(workload: str, repeat: int = 3) -> CaptureCost:
    """Median over ``repeat`` interleaved measurements, one eager step subtracted from each."""
    ours, theirs = [], []
    for _ in range(repeat):
        step = _eager_step_s(workload)
        ours.append(_graphprof_capture_s(workload) - step)
        theirs.append(_aot_eager_compile_s(workload) - step)
    return CaptureCost(workload, statistics.median(ours), statistics.median(theirs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt", "tiny-mlp"], choices=sorted(DEMO_STEPS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| workload | graphprof capture | torch.compile aot_eager | ratio |\n|---|---|---|---|")
    for workload in args.workload:
        r = measure(workload, args.repeat)
        print(f"| {workload} | {r.graphprof_s:.2f} s | {r.aot_eager_s:.2f} s | {r.ratio:.2f} |")


if __name__ == "__main__":
    main()
