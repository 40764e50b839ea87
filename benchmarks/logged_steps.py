"""A step that logs a formatted loss every few calls: traced / eager, in one run.

``if n % every == 0: print(f"step {n} loss {loss.item():.4f}")``: the
replay's print node formats the loss (capture/printed_texts.py), so every
call replays a graph. The same text written with ``sys.stdout.write``
refuses capture on its logging calls (the text is known only once the
replay ran); the calls that do not log have a whole-step graph, and keep
replaying it after the first logging call (capture/refused_paths.py). An
MLP of ``Linear(256, 256)`` layers trained with AdamW, writing into a buffer.

Eager and traced copies (profiling off) run the same batches. After warm-up
calls that include a logging call, the two are timed in alternating rounds of
whole logging periods. Reports the median per-call time of each, their ratio,
and the share of the traced calls that replayed a whole-step graph.

Usage: python -m benchmarks.logged_steps [--every 10] [--sink print write] [--rounds 5] [--periods 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

import graphprof


@dataclass(frozen=True)
class LoggedStepCost:
    every: int
    sink: str  # "print" or "write" (sys.stdout.write)
    eager_ms: float
    traced_ms: float
    whole_step_share: float  # of the timed traced calls

    @property
    def ratio(self) -> float:
        return self.traced_ms / self.eager_ms


#: How the step logs: a print the replay formats, or a write that refuses on its logging calls.
SINKS = ("print", "write")


def _step(every: int, sink: str, layers: int = 4) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"n": 0}

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        state["n"] += 1
        if state["n"] % every == 0:
            if sink == "print":
                print(f"step {state['n']} loss {loss.item():.4f}")
            else:
                sys.stdout.write(f"step {state['n']} loss {loss.item():.4f}\n")
        return loss.detach()

    return step


def _per_call_ms(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, calls: int,
                 modes: list[str] | None = None) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
        if modes is not None:
            modes.append(str(getattr(fn, "capture_mode", None)))
    return (time.perf_counter() - start) / calls * 1e3


def measure(every: int = 10, rounds: int = 5, periods: int = 2, sink: str = "print") -> LoggedStepCost:
    eager, traced = _step(every, sink), graphprof.trace(_step(every, sink), profiling=False)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    calls = every * periods
    modes: list[str] = []
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the one refusal's warning
        for _ in range(2 * every):  # capture, the first refusal, the segments' compile
            eager(x)
            traced(x)
        eager_ms, traced_ms = [], []
        for _ in range(rounds):
            eager_ms.append(_per_call_ms(eager, x, calls))
            traced_ms.append(_per_call_ms(traced, x, calls, modes))
    share = modes.count("whole-step") / len(modes)
    return LoggedStepCost(every, sink, statistics.median(eager_ms), statistics.median(traced_ms), share)


_SINK_NAMES = {"print": "print", "write": "sys.stdout.write"}


def markdown(rows: list[LoggedStepCost]) -> str:
    lines = ["| logs with | logs every | eager step | traced step | traced / eager | calls replayed whole-step |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {_SINK_NAMES[r.sink]} | {r.every} calls | {r.eager_ms:.2f} ms | {r.traced_ms:.2f} ms | "
              f"{r.ratio:.2f} | {r.whole_step_share:.0%} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, nargs="+", default=[10])
    parser.add_argument("--sink", nargs="+", choices=SINKS, default=list(SINKS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--periods", type=int, default=2)
    args = parser.parse_args()
    print(markdown([measure(n, args.rounds, args.periods, sink) for sink in args.sink for n in args.every]))


if __name__ == "__main__":
    main()
