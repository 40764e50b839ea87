"""Why graphprof's time of a tiny op is longer than torch.profiler's event for it, in nanoseconds.

``benchmarks.agreement`` finds graphprof 1.4x torch.profiler on ResNet's
``add`` (16 to 64 floats: batch-norm running statistics) and 1.8x on GPT's
``mul_`` (optimizer ops on 64-float tensors). The two tools time different
intervals:

* graphprof: host timestamp after the previous op node to the timestamp after
  this one. That covers the generated graph code's Python for the node
  (loading arguments, the call into ``OpOverload.__call__``, storing the
  result, dropping inputs whose last use this was), the dispatcher up to the
  kernel, the kernel, and one probe.
* torch.profiler: its ``RecordFunction`` scope, opened inside the dispatcher
  just before the kernel and closed just after it: the kernel and the
  dispatch below that point, nothing of the Python around the call.

This measures, for each op at its real shapes and in one process, per call:
``loop`` (the op called in a plain Python loop: what graphprof's interval
holds, less its probe and the graph code's own variable handling),
``event`` (torch.profiler's mean event duration for the same calls),
``python`` (the same loop calling a trivial Python function of the same
arity: the interpreter's share) and, for ops whose inputs die there, ``free``
(dropping the last reference to tensors of the input sizes, which happens
inside graphprof's interval and outside torch.profiler's event).

Usage: python -m benchmarks.small_op_gap [--calls 20000]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass(frozen=True)
class Gap:
    op: str
    shapes: str
    loop_ns: float
    event_ns: float
    python_ns: float
    free_ns: float | None

    @property
    def ratio(self) -> float:
        return self.loop_ns / self.event_ns if self.event_ns > 0 else float("inf")


def _per_call_ns(fn: Callable[[], Any], calls: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def _event_ns(op: Any, args: tuple[Any, ...], calls: int) -> float:
    """torch.profiler's mean duration of the op's own events (CPU activity only, as light as it gets)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            op(*args)
    name = op.name().split(".")[0]  # aten::add.Tensor is listed as aten::add
    events = [e for e in prof.key_averages() if e.key == name]
    if not events:
        return 0.0
    e = events[0]
    return e.cpu_time_total * 1e3 / e.count  # microseconds -> ns


def _free_ns(shapes: list[tuple[int, ...]], calls: int) -> float:
    """Allocating and dropping tensors of ``shapes``, less allocating and keeping them (so only the free remains)."""
    def alloc_free() -> None:
        for s in shapes:
            t = torch.empty(s)
            del t

    kept: list[torch.Tensor] = []

    def alloc_keep() -> None:
        for s in shapes:
            kept.append(torch.empty(s))
        if len(kept) > 256:
            kept.clear()

    return max(0.0, _per_call_ns(alloc_free, calls // 10) - _per_call_ns(alloc_keep, calls // 10))


def cases() -> list[tuple[str, Any, tuple[Any, ...], list[tuple[int, ...]] | None]]:
    """(label, op, args, shapes of the inputs that die at this node or None) at the demo workloads' shapes."""
    aten = torch.ops.aten
    v16, v64 = torch.randn(16), torch.randn(64)
    go, x = torch.randn(16, 64, 8, 8), torch.randn(16, 64, 8, 8)
    w, rm, rv, sm, si = torch.randn(64), torch.zeros(64), torch.ones(64), torch.zeros(64), torch.ones(64)
    return [
        ("add [16]+[16]", aten.add.Tensor, (v16, v16), None),
        ("mul_ [64] * 1.0", aten.mul_.Tensor, (v64, 1.0), None),
        ("native_batch_norm_backward [16,64,8,8]", aten.native_batch_norm_backward.default,
         (go, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]), [(16, 64, 8, 8), (16, 64, 8, 8)]),
    ]


def measure(calls: int = 20000) -> list[Gap]:
    out = []
    for label, op, args, dying in cases():
        n = calls if dying is None else calls // 20
        loop = _per_call_ns(lambda: op(*args), n)
        event = _event_ns(op, args, n)

        def noop(*a: Any) -> Any:
            return a[0]

        python = _per_call_ns(lambda: noop(*args), n)
        free = _free_ns(dying, n) if dying else None
        out.append(Gap(str(op), label, loop, event, python, free))
    return out


def markdown(gaps: list[Gap]) -> str:
    lines = ["| op (shapes) | loop per call | torch.profiler event | loop / event | Python call alone | free of dying inputs |",
             "|---|---|---|---|---|---|"]
    for g in gaps:
        free = "-" if g.free_ns is None else f"{g.free_ns:.0f} ns"
        lines.append(f"| {g.shapes} | {g.loop_ns:.0f} ns | {g.event_ns:.0f} ns | {g.ratio:.2f} | "
                     f"{g.python_ns:.0f} ns | {free} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(markdown(measure(args.calls)))


if __name__ == "__main__":
    main()
