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

This measures, for each op at its real shapes and in one process, per call
(medians, so that calls the OS descheduled on a shared machine do not count):
``node`` (graphprof's node time: the op repeated in one fx graph, compiled by
graphprof's code generator with the instrument pass's probes), ``no probe``
(the same generated code without probes, per op: node minus this is the
probe), ``OpOverload loop`` (``aten.op.overload(...)`` in a Python loop, with
``OpOverload.__call__``'s Python frame, which the generated code skips),
``binding loop`` (the op through torch's own generated binding, ``torch.add``
or ``Tensor.mul_``, for comparison), ``event`` (torch.profiler's median event
duration for the same calls), ``python`` (a trivial Python function of the
same arity) and, for ops whose inputs die there, ``free`` (dropping the last
reference to tensors of the input sizes, which happens inside graphprof's
interval and outside torch.profiler's event).

Usage: python -m benchmarks.small_op_gap [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
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
    node_ns: float = 0.0  # graphprof's node time in generated graph code (probe included)
    graph_call_ns: float = 0.0  # the same code without probes, per op
    binding_ns: float | None = None  # the op through torch's own Python binding (torch.add, Tensor.mul_)

    @property
    def ratio(self) -> float:
        return self.loop_ns / self.event_ns if self.event_ns > 0 else float("inf")


def _per_call_ns(fn: Callable[[], Any], calls: int, batch: int = 50) -> float:
    """Median over short batches of the per-call time: a batch is ~0.1 ms, so on a shared machine
    most batches run without being descheduled and the median is the undisturbed cost."""
    for _ in range(batch):
        fn()
    per_batch = []
    for _ in range(max(1, calls // batch)):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per_batch.append((time.perf_counter_ns() - t0) / batch)
    return statistics.median(per_batch)


def _event_ns(op: Any, args: tuple[Any, ...], calls: int) -> float:
    """torch.profiler's median duration of the op's own events (CPU activity only, as light as it
    gets); the median, like the loop's, so that descheduled calls do not count."""
    name = op.name().split(".")[0]  # aten::add.Tensor is listed as aten::add
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            op(*args)
    durations = [e.cpu_time_total * 1e3 for e in prof.events() if e.name == name]  # microseconds -> ns
    return statistics.median(durations) if durations else 0.0


def _graph_ns(op: Any, args: tuple[Any, ...], count: int = 200, repeat: int = 30) -> tuple[float, float]:
    """(graphprof's median node time, per-op time of the same code without probes), in ns.

    ``count`` calls of ``op`` on the same inputs in one fx graph, compiled by
    graphprof's own code generator (runtime/codegen.py) with and without the
    instrument pass's probes: exactly what a node of a profiled step runs.
    Each result is unused, so it is dropped right after its call, inside the
    node's interval (as an input whose last use is the node is in a real step).
    """
    import torch.fx

    from graphprof.passes.instrument import instrument
    from graphprof.runtime.codegen import compile_graph

    graph = torch.fx.Graph()
    holders = [graph.placeholder(f"a{i}") if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    for _ in range(count):
        graph.call_function(op, tuple(holders))
    graph.output(None)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    plain, probed = compile_graph(gm), compile_graph(instrument(gm))
    nodes: list[list[int]] = [[] for _ in range(count)]
    calls: list[float] = []
    for _ in range(repeat):
        _, stamps = probed(*tensors)
        for i in range(count):
            nodes[i].append(stamps[i + 1] - stamps[i])
        t0 = time.perf_counter_ns()
        plain(*tensors)
        calls.append((time.perf_counter_ns() - t0) / count)
    return statistics.median(statistics.median(n) for n in nodes), statistics.median(calls)


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

    return max(0.0, _per_call_ns(alloc_free, calls, batch=5) - _per_call_ns(alloc_keep, calls, batch=5))


def cases() -> list[tuple[str, Any, tuple[Any, ...], list[tuple[int, ...]] | None, Callable[..., Any] | None]]:
    """(label, op, args, shapes of the inputs that die at this node or None, the op's own Python
    binding or None) at the demo workloads' shapes."""
    aten = torch.ops.aten
    v16, v64 = torch.randn(16), torch.randn(64)
    go, x = torch.randn(16, 64, 8, 8), torch.randn(16, 64, 8, 8)
    w, rm, rv, sm, si = torch.randn(64), torch.zeros(64), torch.ones(64), torch.zeros(64), torch.ones(64)
    return [
        ("add [16]+[16]", aten.add.Tensor, (v16, v16), None, torch.add),
        ("mul_ [64] * 1.0", aten.mul_.Tensor, (v64, 1.0), None, torch.Tensor.mul_),
        ("native_batch_norm_backward [16,64,8,8]", aten.native_batch_norm_backward.default,
         (go, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]), [(16, 64, 8, 8), (16, 64, 8, 8)], None),
    ]


def measure(calls: int = 20000) -> list[Gap]:
    out = []
    for label, op, args, dying, binding in cases():
        n = calls if dying is None else calls // 20
        batch = 50 if dying is None else 5
        loop = _per_call_ns(lambda op=op, args=args: op(*args), n, batch)
        node, graph_call = _graph_ns(op, args, count=200 if dying is None else 20)
        fast = _per_call_ns(lambda f=binding, args=args: f(*args), n, batch) if binding is not None else None
        event = _event_ns(op, args, n)

        def noop(*a: Any) -> Any:
            return a[0]

        python = _per_call_ns(lambda args=args: noop(*args), n, batch)
        free = _free_ns(dying, n) if dying else None
        out.append(Gap(str(op), label, loop, event, python, free, node, graph_call, fast))
    return out


def markdown(gaps: list[Gap]) -> str:
    lines = ["| op (shapes) | graphprof node | same code, no probe | OpOverload loop | torch's binding loop "
             "| torch.profiler event | node / event | loop / event | Python call alone | free of dying inputs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for g in gaps:
        free = "-" if g.free_ns is None else f"{g.free_ns:.0f} ns"
        fast = "-" if g.binding_ns is None else f"{g.binding_ns:.0f} ns"
        node_ratio = g.node_ns / g.event_ns if g.event_ns > 0 else float("inf")
        lines.append(f"| {g.shapes} | {g.node_ns:.0f} ns | {g.graph_call_ns:.0f} ns | {g.loop_ns:.0f} ns | {fast} | "
                     f"{g.event_ns:.0f} ns | {node_ratio:.2f} | {g.ratio:.2f} | {g.python_ns:.0f} ns | {free} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(markdown(measure(args.calls)))


if __name__ == "__main__":
    main()
