"""Probe overhead on real training loops: schedulers, accumulation counters.

The demo GPT (AdamW) trained three ways users write it:

  sched-inside   ``clip_grad_norm_``, ``opt.step()``, ``sched.step()`` (a
                 LambdaLR warm-up) inside the traced step: the scheduler is a
                 replayed host node, the learning rate a graph input;
  sched-outside  the same scheduler stepped by the loop after each call: the
                 learning rate changes every call, no re-capture;
  accumulation   ``self.micro += 1; if self.micro % 4 == 0: opt.step()``:
                 several captured paths, chosen per call by guards.

For each, the traced-with-probes step time over the eager step time, the
variants interleaved round after round on one shared model (see
overhead.py), median of per-round ratios. Target: at most 1.05.

Usage: python -m benchmarks.real_loops [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

import graphprof
from graphprof.demo.steps import gpt_adamw_step

TARGET = 1.05
LOOPS = ("sched-inside", "sched-outside", "accumulation")


@dataclass(frozen=True)
class LoopResult:
    loop: str
    eager_ms: float
    probed_over_eager: float
    captures: int
    capture_mode: str


def _warmup(current: int) -> float:
    return min(1.0, (current + 1) / 100)


def _build(loop: str) -> tuple[Callable[..., Any], Callable[[], None], Callable[[int], tuple]]:
    """The step, what the loop does after each call, and the inputs."""
    demo = gpt_adamw_step(seed=0)
    model, opt = demo.model, demo.optimizer
    assert opt is not None
    sched = LambdaLR(opt, _warmup)
    loss_fn = torch.nn.functional.cross_entropy

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return loss_fn(logits.view(-1, logits.size(-1)), y.view(-1))

    if loop == "sched-inside" or loop == "sched-outside":
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if loop == "sched-inside":
                sched.step()
            return loss

        after = (lambda: sched.step()) if loop == "sched-outside" else (lambda: None)
        return step, after, demo.make_inputs

    class Trainer:
        def __init__(self) -> None:
            self.micro = 0

        def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = loss_of(x, y) / 4
            loss.backward()
            self.micro += 1
            if self.micro % 4 == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
            return loss

    return Trainer().step, lambda: None, demo.make_inputs


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(loop: str, rounds: int = 20) -> LoopResult:
    step, after, make_inputs = _build(loop)
    traced = graphprof.trace(step, profiling=True)
    inputs = make_inputs(0)

    def eager() -> None:
        step(*inputs)
        after()

    def probed() -> None:
        traced(*inputs)
        after()

    for _ in range(12):  # eager call, captures of every path, first replays
        probed()
    ratios, eager_times = [], []
    for _ in range(rounds):
        # Four calls each: one accumulation cycle, so both variants take the same paths.
        e = sum(_timed(eager) for _ in range(4))
        p = sum(_timed(probed) for _ in range(4))
        ratios.append(p / e)
        eager_times.append(e / 4)
    return LoopResult(loop, statistics.median(eager_times) * 1e3, statistics.median(ratios), traced.captures,
                      traced.capture_mode or "-")


def markdown(results: list[LoopResult]) -> str:
    lines = ["| loop | eager step | probes / eager | captures | capture |", "|---|---|---|---|---|"]
    for r in results:
        mark = "met" if r.probed_over_eager <= TARGET else "MISSED"
        lines.append(f"| {r.loop} | {r.eager_ms:.2f} ms | {r.probed_over_eager:.3f} ({mark}, target <= {TARGET}) "
                     f"| {r.captures} | {r.capture_mode} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--loop", nargs="*", default=list(LOOPS), choices=LOOPS)
    args = parser.parse_args()
    print(markdown([measure(loop, rounds=args.rounds) for loop in args.loop]))


if __name__ == "__main__":
    main()
