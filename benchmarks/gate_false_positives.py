"""How often does ``graphprof diff --fail-if-slower PCT`` fire on identical code?

Both profiles of a pair draw their step times from the same distribution:
``1 + N(0, σ)`` relative to the true step time, and, in the heavy-tailed
variant, a 30% slower step with probability 0.1 (a GC pause, a preempted
core). Each row is the share of pairs the gate calls a regression; every
such call is a false positive. Run-to-run shifts of the whole machine (one
run 20% slower throughout) are not in the model: the steps of one profile
cannot show them, so a gate on two single profiles needs a threshold above
the machine's run-to-run variation (see the README).

Usage: python -m benchmarks.gate_false_positives [--pairs 20000] [--threshold 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import random

from graphprof.analysis.regression import compare_step_times, regression_gate


def steps(rng: random.Random, n: int, sigma: float, heavy: bool) -> list[float]:
    out = []
    for _ in range(n):
        t = 1e-3 * (1 + rng.gauss(0, sigma))
        if heavy and rng.random() < 0.1:
            t *= 1.3
        out.append(t)
    return out


def false_positive_rate(pairs: int, n: int, sigma: float, heavy: bool, threshold_pct: float = 5.0,
                        seed: int = 0) -> float:
    """The share of identical-code pairs of ``n``-step profiles that the gate fails."""
    rng = random.Random(seed)
    fired = 0
    for _ in range(pairs):
        comparison = compare_step_times(steps(rng, n, sigma, heavy), steps(rng, n, sigma, heavy))
        fired += regression_gate(comparison, threshold_pct).regressed
    return fired / pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--threshold", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"false-positive rate of --fail-if-slower {args.threshold:g} on identical code, {args.pairs} pairs each")
    print("noise          sigma   3 steps   5 steps  10 steps")
    for heavy in (False, True):
        for sigma in (0.01, 0.03, 0.05, 0.10):
            rates = [false_positive_rate(args.pairs, n, sigma, heavy, args.threshold, args.seed) for n in (3, 5, 10)]
            print(f"{'heavy-tailed' if heavy else 'normal':12s} {sigma:6.0%}  " + "  ".join(f"{100 * r:7.2f}%" for r in rates))


if __name__ == "__main__":
    main()
