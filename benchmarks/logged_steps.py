"""A step that logs a formatted loss every few calls: traced / eager, in one run.

``if n % every == 0: print(f"step {n} loss {loss.item():.4f}")`` refuses
capture on its logging calls (the text is known only once the replay ran).
The calls that do not log have a whole-step graph; whether they keep
replaying it after the first logging call is what this measures
(capture/refused_paths.py). An MLP of ``Linear(256, 256)`` layers trained with
AdamW, printing into a buffer.

Eager and traced copies (profiling off) run the same batches. After warm-up
calls that include a logging call, the two are timed in alternating rounds of
whole logging periods. Reports the median per-call time of each, their ratio,
and the share of the traced calls that replayed a whole-step graph.

Usage: python -m benchmarks.logged_steps [--every 10] [--rounds 5] [--periods 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

import graphprof


@dataclass(frozen=True)
class LoggedStepCost:
    every: int
    eager_ms: float
    traced_ms: float
    whole_step_share: float  # of the timed traced calls

    @property
    def ratio(self) -> float:
        return self.traced_ms / self.eager_ms


def _step(every: int, layers: int = 4) -> Callable[[torch.Tensor], torch.Tensor]:
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
            print(f"step {state['n']} loss {loss.item():.4f}")
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


def measure(every: int = 10, rounds: int = 5, periods: int = 2) -> LoggedStepCost:
    eager, traced = _step(every), graphprof.trace(_step(every), profiling=False)
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
    return LoggedStepCost(every, statistics.median(eager_ms), statistics.median(traced_ms), share)


def markdown(rows: list[LoggedStepCost]) -> str:
    lines = ["| logs every | eager step | traced step | traced / eager | calls replayed whole-step |",
             "|---|---|---|---|---|"]
    lines += [f"| {r.every} calls | {r.eager_ms:.2f} ms | {r.traced_ms:.2f} ms | {r.ratio:.2f} | "
              f"{r.whole_step_share:.0%} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, nargs="+", default=[10])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--periods", type=int, default=2)
    args = parser.parse_args()
    print(markdown([measure(n, args.rounds, args.periods) for n in args.every]))


if __name__ == "__main__":
    main()
