"""Coverage step by step, at 1 and 2 torch threads: how much of each step's wall time the nodes account for.

For profiled step k, coverage_k = (sum over every node of every graph of its
host time in step k) / (wall time of step k). Taking the ratio per step and
then the median over steps (not a sum of per-node medians over a median wall
time) keeps it stable on a loaded machine: a slow step slows its nodes and
its wall time alike. What coverage misses is graphprof's own per-call work
around the graphs (input-signature check, guards, pytree flattening,
collecting the stamps). Target: at least 0.97 on every workload.

Usage: python -m benchmarks.coverage_threads [--workload resnet gpt tiny-mlp] [--threads 1 2] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from dataclasses import dataclass

import torch

import graphprof
from graphprof.demo.steps import DEMO_STEPS
from graphprof.profile.model import Profile

TARGET = 0.97


@dataclass(frozen=True)
class CoverageResult:
    workload: str
    threads: int
    steps: int
    median: float
    minimum: float
    maximum: float


def step_coverages(profile: Profile) -> list[float]:
    """coverage_k of every profiled step k (see the module docstring)."""
    nodes = [n for _, n in profile.iter_nodes()]
    out = []
    for k, step in enumerate(profile.steps):
        if step.wall_time_s > 0:
            out.append(sum(n.host_time_s[k] for n in nodes if k < len(n.host_time_s)) / step.wall_time_s)
    return out


def measure(workload: str, threads: int, steps: int = 20) -> CoverageResult:
    """Profile ``steps`` steps of a demo workload at ``threads`` torch threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        demo = DEMO_STEPS[workload](seed=0)
        inputs = demo.make_inputs(0)
        traced = graphprof.trace(demo.step_fn, profiling=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(3 + steps):  # eager, capture, first replay, then profiled steps
                traced(*inputs)
        values = step_coverages(traced.get_profile())
    finally:
        torch.set_num_threads(before)
    return CoverageResult(workload, threads, len(values), statistics.median(values), min(values), max(values))


def markdown(results: list[CoverageResult]) -> str:
    lines = ["| workload | torch threads | steps | coverage (median of per-step ratios) | min | max | target |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.workload} | {r.threads} | {r.steps} | {r.median:.3f} | {r.minimum:.3f} | "
                     f"{r.maximum:.3f} | {'met' if r.median >= TARGET else 'MISSED'} (>= {TARGET}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt", "tiny-mlp"], choices=sorted(DEMO_STEPS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per run (default 20)")
    args = parser.parse_args(argv)
    print(markdown([measure(w, t, args.steps) for w in args.workload for t in args.threads]))


if __name__ == "__main__":
    main()
