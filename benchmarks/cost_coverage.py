"""Cost-model coverage on the demo training steps: share of op nodes and of op
time (median host time per node over the profiled steps) that have a FLOP
formula, the ops without one, and the step's FLOPs and bytes by phase.

Usage: python -m benchmarks.cost_coverage [--workload resnet gpt] [--steps N]
"""

from __future__ import annotations

import argparse
import collections

import graphprof
from graphprof.analysis.coverage import CostCoverage, cost_coverage
from graphprof.analysis.stats import stat_fn
from graphprof.demo.steps import DEMO_STEPS


def measure(workload: str, steps: int = 10) -> tuple[CostCoverage, graphprof.Profile]:
    """Profile ``steps`` steps of a demo at its default sizes and compute the coverage."""
    demo = DEMO_STEPS[workload]()
    fn = graphprof.trace(demo.step_fn)
    inputs = demo.make_inputs(0)
    for _ in range(2 + steps):  # eager, capture, then profiled replays
        fn(*inputs)
    profile = fn.get_profile()
    return cost_coverage(profile), profile


def _by_phase(profile: graphprof.Profile) -> dict[str, list[float]]:
    median = stat_fn("median")
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for _, node in profile.iter_nodes():
        row = totals[node.phase.value]
        row[0] += node.flops or 0
        row[1] += (node.bytes_read or 0) + (node.bytes_written or 0)
        row[2] += median(node.host_time_s)
        row[3] += 1
    return dict(totals)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt"], choices=sorted(DEMO_STEPS))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    for workload in args.workload:
        cov, profile = measure(workload, args.steps)
        print(f"{workload}: {cov.covered_nodes}/{cov.nodes} op nodes with a formula "
              f"({100 * cov.node_share:.2f}%), {100 * cov.time_share:.2f}% of op time "
              f"({cov.covered_time_s * 1e3:.3f} of {cov.time_s * 1e3:.3f} ms, median over {len(profile.steps)} steps)")
        for u in cov.uncovered:
            print(f"  no formula: {u.op}  nodes={u.nodes}  time={u.time_s * 1e6:.1f} us")
        for phase, (flops, moved, time_s, nodes) in sorted(_by_phase(profile).items()):
            rate = flops / time_s / 1e9 if time_s > 0 else 0.0
            print(f"  {phase:9s} nodes={int(nodes):4d}  GFLOP={flops / 1e9:8.4f}  MB moved={moved / 1e6:8.2f}  "
                  f"time={time_s * 1e3:8.3f} ms  GFLOP/s={rate:7.2f}")


if __name__ == "__main__":
    main()
