"""Overhead, fidelity and coverage of graphprof on the demo training steps.

Everything is a ratio measured in one run: the variants run interleaved,
round after round, on one shared model and optimizer (see ``measure``), and
each ratio is the median over rounds of per-round ratios (so a noisy
neighbour slows all variants of a round alike).

  fidelity  = captured graph without probes / eager
  overhead  = graph with probes / graph without probes
  probes/eager = graph with probes / eager (the cost a user sees; target <= 1.03)
  coverage  = sum of node times (step graph and its host graph, graphprof's own
              ``graphprof.overhead`` node left out) / step wall time, step by step
  idle schedule = graph with a schedule whose active window is never reached /
              graph without probes (steps outside the window must cost nothing)
  segmented fidelity = torch.compile/AOTAutograd segments without probes / eager
              (capture="dynamo"; only with --segmented)
  torch.profiler = eager inside torch.profiler(record_shapes, profile_memory,
              with_flops) / eager; time is taken inside the active profiler,
              so its start/stop and post-processing are not counted.

Usage: python -m benchmarks.overhead [--workload resnet gpt tiny-mlp hf-bert hf-gpt2] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

import graphprof
from benchmarks.hf_workloads import WORKLOAD_NAMES, workload_step
from graphprof.analysis.steps import step_accounts
from graphprof.demo.steps import DemoStep


@dataclass(frozen=True)
class OverheadResult:
    workload: str
    eager_ms: float
    fidelity: float
    overhead: float
    probes_vs_eager: float
    coverage: float
    torch_profiler: float
    idle_schedule: float
    nodes: int
    segmented_fidelity: float | None = None


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(workload: str, rounds: int = 30, steps_per_round: int = 3, segmented: bool = False) -> OverheadResult:
    """Interleaved rounds of every variant, all on ONE model and optimizer.

    Separate model copies would put each variant's tensors at different
    addresses and the ratios would partly measure that. Every variant does
    the same update of the same state (eager, graph and segments all apply
    the same optimizer step), so sharing one copy is sound: the plain and
    probed graph are even the same traced function with ``profiling``
    toggled, so their ratio is the probes' cost and nothing else.
    """
    demo: DemoStep = workload_step(workload, seed=0)
    inputs = demo.make_inputs(0)
    traced = graphprof.trace(demo.step_fn, profiling=True)
    idle = graphprof.trace(demo.step_fn, schedule=graphprof.schedule(skip_first=10**9))
    seg = graphprof.trace(demo.step_fn, capture="dynamo", profiling=False) if segmented else None
    for _ in range(3):  # eager warm-up, capture, first replay
        demo.step_fn(*inputs)
        traced(*inputs)
        idle(*inputs)
        if seg is not None:
            seg(*inputs)

    def graph(profiling: bool) -> Callable[[], object]:
        def run() -> object:
            traced.profiling = profiling
            return traced(*inputs)
        return run

    variants: dict[str, Callable[[], object]] = {
        "eager": lambda: demo.step_fn(*inputs),
        "plain": graph(False),
        "probed": graph(True),
        "idle": lambda: idle(*inputs),
    }
    if seg is not None:
        variants["segmented"] = lambda: seg(*inputs)
    ratios: dict[str, list[float]] = {"fidelity": [], "overhead": [], "probes_vs_eager": [], "torch_profiler": [], "idle": [], "segmented": []}
    eager_times = []
    activities = [torch.profiler.ProfilerActivity.CPU]
    for _ in range(rounds):
        per = {name: min(_timed(fn) for _ in range(steps_per_round)) for name, fn in variants.items()}
        with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True, with_flops=True):
            per["torchprof"] = min(_timed(variants["eager"]) for _ in range(steps_per_round))
        eager_times.append(per["eager"])
        ratios["fidelity"].append(per["plain"] / per["eager"])
        ratios["overhead"].append(per["probed"] / per["plain"])
        ratios["probes_vs_eager"].append(per["probed"] / per["eager"])
        ratios["torch_profiler"].append(per["torchprof"] / per["eager"])
        ratios["idle"].append(per["idle"] / per["plain"])
        if seg is not None:
            ratios["segmented"].append(per["segmented"] / per["eager"])
    traced.profiling = True
    profile = traced.get_profile()
    graph_nodes = profile.graphs[0].nodes
    # Every node of every graph: the step graph and its host graph (dropping and
    # assigning .grad, which eager does in zero_grad and AccumulateGrad), but not
    # graphprof's own node.
    coverages = [a.coverage for a in step_accounts(profile)]
    return OverheadResult(
        workload=workload,
        eager_ms=statistics.median(eager_times) * 1e3,
        fidelity=statistics.median(ratios["fidelity"]),
        overhead=statistics.median(ratios["overhead"]),
        probes_vs_eager=statistics.median(ratios["probes_vs_eager"]),
        coverage=statistics.median(coverages),
        torch_profiler=statistics.median(ratios["torch_profiler"]),
        idle_schedule=statistics.median(ratios["idle"]),
        nodes=len(graph_nodes),
        segmented_fidelity=statistics.median(ratios["segmented"]) if seg is not None else None,
    )


def markdown(results: list[OverheadResult]) -> str:
    lines = [
        "| workload | nodes | eager step | fidelity (graph/eager) | overhead (probes/graph) | probes/eager | coverage "
        "| idle schedule/graph | segmented/eager | torch.profiler/eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.workload} | {r.nodes} | {r.eager_ms:.2f} ms | {r.fidelity:.3f} | {r.overhead:.3f} | "
                     f"{r.probes_vs_eager:.3f} | "
                     f"{r.coverage:.3f} | {r.idle_schedule:.3f} | "
                     f"{'-' if r.segmented_fidelity is None else f'{r.segmented_fidelity:.3f}'} | {r.torch_profiler:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", nargs="+", default=["resnet"], choices=WORKLOAD_NAMES)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--segmented", action="store_true", help="also measure capture='dynamo' segments")
    args = parser.parse_args()
    results = [measure(w, rounds=args.rounds, segmented=args.segmented) for w in args.workload]
    print(markdown(results))


if __name__ == "__main__":
    main()
