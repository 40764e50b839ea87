"""Figures of the conformance suite's Hugging Face models (tests/conformance/models.py).

Per architecture: how the step was captured, how many graphs, op nodes in the
profiled graph, the share of op nodes that carry a module, and the step time
traced with probes over eager. Eager and traced copies run interleaved, round
after round, on the same inputs (batches alternate without and with padding,
so masked models switch between their two graphs); the ratio is the median of
per-round ratios, after 4 warm-up calls (eager, capture, workspace, first).

Runs with one torch thread by default: on a small shared machine a parallel
region waits on its slowest thread, and single steps then vary tenfold.

Usage: python -m benchmarks.conformance [--rounds N] [--threads N] [--arch NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

import graphprof
from tests.conformance.models import ARCHITECTURES, Architecture, build

WARMUP = 4


@dataclass(frozen=True)
class ConformanceFigures:
    name: str
    capture_mode: str
    graphs: int
    op_nodes: int
    with_module: float
    eager_ms: float
    traced_over_eager: float


def measure(arch: Architecture, rounds: int) -> ConformanceFigures:
    torch.manual_seed(0)
    _, eager = build(arch)
    torch.manual_seed(0)
    _, step = build(arch)
    traced = graphprof.trace(step, profiling=True)
    eager_s, ratios = [], []
    for i in range(WARMUP + rounds):
        args = arch.inputs(i)
        t0 = time.perf_counter()
        eager(*args)
        t1 = time.perf_counter()
        traced(*args)
        t2 = time.perf_counter()
        if i >= WARMUP:
            eager_s.append(t1 - t0)
            ratios.append((t2 - t1) / (t1 - t0))
    profile = traced.get_profile()
    ops = [n for g in profile.graphs if g.kind == "step" for n in g.nodes if n.op.startswith("aten.")]
    return ConformanceFigures(arch.name, traced.capture_mode or "", traced.captures, len(ops),
                              sum(bool(n.module) for n in ops) / max(1, len(ops)),
                              statistics.median(eager_s) * 1e3, statistics.median(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--arch", nargs="*", default=[a.name for a in ARCHITECTURES])
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    print(f"torch {torch.__version__}, {options.threads} thread(s), {options.rounds} rounds after {WARMUP} warm-up")
    print("| architecture | capture | graphs | op nodes | with module | eager step | traced with probes / eager |")
    print("|---|---|---|---|---|---|---|")
    for arch in ARCHITECTURES:
        if arch.name not in options.arch:
            continue
        f = measure(arch, options.rounds)
        print(f"| {f.name} | {f.capture_mode} | {f.graphs} | {f.op_nodes} | {f.with_module:.1%} | "
              f"{f.eager_ms:.1f} ms | {f.traced_over_eager:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
