"""Replaying a step whose guards recompute many values: replay / eager, in one run.

The step: a deep stack of ``Linear(4, 4)`` layers trained with RAdam and
``foreach=True`` (the default on a GPU). RAdam reads each parameter's step
count three times with ``.item()`` and branches on the result twice, so
before every replay the guard check recomputes three values per parameter
from copies of the counts (capture/shared_prefixes.py). Tiny layers make
the check's share of the step as large as it gets.

Eager and traced copies (profiling off) run the same batches; after a few
calls each to capture and warm up, the two are timed in alternating rounds
(a burst of load on a shared machine slows one round of both, not one
side). Reports the median per-call time of each and their ratio.

Usage: python -m benchmarks.guard_checks [--layers 100] [--rounds 5] [--calls 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

import graphprof


@dataclass(frozen=True)
class GuardCheckCost:
    layers: int
    eager_ms: float
    replay_ms: float

    @property
    def ratio(self) -> float:
        return self.replay_ms / self.eager_ms


def _step(layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    opt = torch.optim.RAdam(model.parameters(), lr=1e-3, foreach=True)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _per_call_ms(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e3


def measure(layers: int = 100, rounds: int = 5, calls: int = 10, warm: int = 6) -> GuardCheckCost:
    eager, traced = _step(layers), graphprof.trace(_step(layers), profiling=False)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to segments would time something else
        for _ in range(warm):
            eager(x)
            traced(x)
    if traced.capture_mode != "whole-step":
        raise RuntimeError(f"the step was not replayed whole-step ({traced.capture_mode})")
    eager_ms, replay_ms = [], []
    for _ in range(rounds):
        eager_ms.append(_per_call_ms(eager, x, calls))
        replay_ms.append(_per_call_ms(traced, x, calls))
    return GuardCheckCost(layers, statistics.median(eager_ms), statistics.median(replay_ms))


def markdown(rows: list[GuardCheckCost]) -> str:
    lines = ["| layers | eager step | replayed step | replay / eager |", "|---|---|---|---|"]
    lines += [f"| {r.layers} | {r.eager_ms:.2f} ms | {r.replay_ms:.2f} ms | {r.ratio:.2f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    print(markdown([measure(n, args.rounds, args.calls) for n in args.layers]))


if __name__ == "__main__":
    main()
