"""Where graphprof's extra time on ResNet's batch-norm backward goes, in us per call.

``benchmarks.agreement`` finds graphprof's node time of
``aten.native_batch_norm_backward`` on the demo ResNet step ~1.13x
torch.profiler's event for the same calls. This splits each call's node
interval (probe after the previous node to the probe after this one) at the
profiler's own event boundaries, in one run: both clocks read
CLOCK_REALTIME (graphprof's probes use ``time.time_ns`` here, torch.profiler
converts its TSC readings to the same clock), so per call

    node = Python to the call + entry (binding, schema-driven argument parsing,
           dispatch up to the profiler's RecordFunction) + event
           + exit (profiler's exit, results wrapped for Python)
           + frees of the inputs dying there + probe

Two extra stamps (just before the call, and just after it, before the
``del``) mark the call. Rows, medians per node over interleaved rounds, then
the mean over the step's 9 nodes:

* ``in step``: the step's instrumented graph under torch.profiler.
* ``in step, warmed``: the same, with the op first called on tiny tensors
  right before each real call (that call is in "Python to the call"): the
  op's binding, schema, dispatch entry and kernel code are then hot, the
  real call's tensors are not.
* ``hot loop``: the op repeated on tensors of the first node's shapes.

Below the table: the node without the profiler; eager autograd's event for
the op and the engine's ``evaluate_function`` event around it (eager's
counterpart of a node: the op plus the engine's own work for it); the tiny
call's own time in the step, in a loop, and in a loop after 10 ms of
spinning; minor page faults (ru_minflt) of each call.

What it shows: the event is the same kernel in the graph and in eager
(equal durations, no page faults). The node's extra time is outside the
event: the op's entry from Python (binding, schema-driven argument parsing,
dispatch up to the profiler's RecordFunction), its exit (three results
wrapped for Python), and the frees of its dying inputs. A hot loop shows
~7 us of that; in the step, where each call follows milliseconds of other
work, the op's code and metadata are cold and it is ~45 us (entry alone
~29 us; ~9 us after the warm-up call). The tiny call shows the same cold
cost with no work at all: ~13 us hot, ~85 us in the step. torch.profiler's
event starts inside the dispatcher, so it leaves that out; eager's engine
event around the op holds its own cold overhead of the same size.

Usage: python -m benchmarks.bn_backward_gap [--rounds 15]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.profiler import ProfilerActivity, profile

from graphprof.capture.captured_step import run_captured
from graphprof.demo.steps import DEMO_STEPS
from graphprof.passes.instrument import instrument
from graphprof.passes.records import PROBE_AFTER
from graphprof.runtime.codegen import compile_graph
from graphprof.runtime.whole_step_runner import WholeStepRunner

OP = torch.ops.aten.native_batch_norm_backward.default
EVENT = "aten::native_batch_norm_backward"
ENGINE_EVENT = "autograd::engine::evaluate_function: NativeBatchNormBackward0"


@dataclass(frozen=True)
class Split:
    """One call's node interval cut at its profiler event, in ns (see the module docstring)."""

    python_ns: float  # previous probe to the call
    entry_ns: float  # call to the event's start
    event_ns: float
    exit_ns: float  # event's end to the call's return
    frees_ns: float  # return to the next probe: the del of dying inputs and the probe

    @property
    def node_ns(self) -> float:
        return self.python_ns + self.entry_ns + self.event_ns + self.exit_ns + self.frees_ns


class Marks:
    """Clock readings just before and just after each call of the op, in graph order."""

    def __init__(self, reading: Callable[[], int] = time.time_ns) -> None:
        self.before: list[int] = []
        self.after: list[int] = []
        self._reading = reading

    def mark_before(self) -> None:
        self.before.append(self._reading())

    def mark_after(self, *dying: Any) -> None:
        """Takes the inputs that die at the op so that their ``del`` comes after this mark."""
        self.after.append(self._reading())

    def clear(self) -> None:
        self.before.clear()
        self.after.clear()


class TinyCall:
    """The op on 2x64x1x1 tensors, timing itself: runs the op's binding, schema parsing, dispatch and
    kernel code while touching almost no data, so its time is what that code costs hot or cold."""

    def __init__(self) -> None:
        c = 64
        self.args = (torch.randn(2, c, 1, 1), torch.randn(2, c, 1, 1), torch.randn(c), torch.zeros(c),
                     torch.ones(c), torch.zeros(c), torch.ones(c), True, 1e-5, [True, True, True])
        self.times_ns: list[int] = []

    def __call__(self) -> None:
        t0 = time.time_ns()
        OP(*self.args)
        self.times_ns.append(time.time_ns() - t0)


def marked_graph(runner: WholeStepRunner, marks: Marks, warm: TinyCall | None = None
                 ) -> tuple[Callable[..., Any], list[int]]:
    """The step's graph instrumented with ``time.time_ns`` probes and the op's calls marked.

    Returns the generated code and, per call of the op, the slot of the probe after it.
    """
    captured = runner.captured.graph_module
    gm = instrument(captured, time.time_ns)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        for used in node.all_input_nodes:
            last_use[used] = node
    slots = {n.name: n.meta[PROBE_AFTER].slot for n in captured.graph.nodes if PROBE_AFTER in n.meta}
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is OP]
    for node in calls:
        dying = tuple(a for a in node.all_input_nodes if last_use[a] is node and order[a] < order[node])
        with gm.graph.inserting_before(node):
            if warm is not None:
                gm.graph.call_function(warm.__call__, ())
            gm.graph.call_function(marks.mark_before, ())
        with gm.graph.inserting_after(node):
            gm.graph.call_function(marks.mark_after, dying)
    gm.recompile()
    return compile_graph(gm), [slots[n.name] for n in calls]


def _events(prof: profile) -> list[tuple[int, int]]:
    """(start, end) in ns of the op's events, in order.

    Read from the raw results, whose times are whole ns on CLOCK_REALTIME
    (``prof.events()`` rounds them to us relative to the trace's start).
    """
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise RuntimeError("torch.profiler recorded nothing")
    return sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in results.events() if e.name() == EVENT)


def _inside(events: list[tuple[int, int]], before: list[int], after: list[int]) -> list[tuple[int, int]]:
    """For each marked call, the event that starts between its marks (warm-up calls' events fall outside)."""
    return [next(e for e in events if b <= e[0] <= a) for b, a in zip(before, after)]


def split_step(runner: WholeStepRunner, leaves: list[Any], graph: Callable[..., Any], slots: list[int],
               marks: Marks) -> list[Split]:
    """One step of ``graph`` under torch.profiler: each call of the op split at its event."""
    marks.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _, stamps, _ = run_captured(runner.captured, graph, leaves, instrumented=True, clock=time.time_ns)
    events = _inside(_events(prof), marks.before, marks.after)
    return [Split(b - stamps[s - 1], e0 - b, e1 - e0, a - e1, stamps[s] - a)
            for s, b, a, (e0, e1) in zip(slots, marks.before, marks.after, events)]


def unprofiled_step(runner: WholeStepRunner, leaves: list[Any], graph: Callable[..., Any], slots: list[int],
                    marks: Marks) -> list[Split]:
    """One step of ``graph`` without torch.profiler: no event to cut at, so the whole call is ``event_ns``."""
    marks.clear()
    _, stamps, _ = run_captured(runner.captured, graph, leaves, instrumented=True, clock=time.time_ns)
    return [Split(b - stamps[s - 1], 0, a - b, 0, stamps[s] - a) for s, b, a in zip(slots, marks.before, marks.after)]


def eager_events_ns(step: Callable[..., Any], inputs: tuple[Any, ...]) -> list[tuple[float, float]]:
    """Per call in one eager step: torch.profiler's op event, and the autograd engine's event around it
    (``evaluate_function``: the node's saved tensors unpacked and released, its gradient buffers)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(*inputs)
    engine = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in prof.profiler.kineto_results.events()
                    if e.name() == ENGINE_EVENT)
    return [(float(e1 - e0), float(n1 - n0)) for (e0, e1), (n0, n1) in zip(_events(prof), engine)]


def faults_per_call(runner: WholeStepRunner, leaves: list[Any]) -> list[int]:
    """Minor page faults of this thread during each call of the op (first touches of fresh memory)."""
    marks = Marks(lambda: resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)
    graph, _ = marked_graph(runner, marks)
    run_captured(runner.captured, graph, leaves, instrumented=True, clock=time.time_ns)
    return [a - b for b, a in zip(marks.before, marks.after)]


def hot_loop(args: tuple[Any, ...], calls: int = 40) -> Split:
    """The op repeated on the same tensors, split at its events like a node (no frees: inputs stay alive)."""
    before, after = [], []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            b = time.time_ns()
            out = OP(*args)
            after.append(time.time_ns())
            before.append(b)
            del out
    splits = [Split(0, e0 - b, e1 - e0, a - e1, 0) for b, a, (e0, e1) in zip(before, after, _inside(_events(prof), before, after))]
    return _median_split([[s] for s in splits])


def _tiny_loop_ns(tiny: TinyCall, idle_ns: int = 0, calls: int = 60) -> float:
    """The tiny call's median time when it repeats after ``idle_ns`` of spinning on the clock.

    With no idle time its code and metadata stay hot. The spin touches no
    memory of ours, so what it adds is only what the rest of the machine (the
    other core, other processes) evicts meanwhile.
    """
    tiny.times_ns.clear()
    for _ in range(calls):
        end = time.perf_counter_ns() + idle_ns
        while time.perf_counter_ns() < end:
            pass
        tiny()
    return statistics.median(tiny.times_ns[calls // 10:])


def _median_split(rounds: list[list[Split]]) -> Split:
    """Per call position the median of each part over rounds, then the mean over positions."""
    n = len(rounds[0])
    fields = ("python_ns", "entry_ns", "event_ns", "exit_ns", "frees_ns")
    means = [sum(statistics.median(getattr(r[i], f) for r in rounds) for i in range(n)) / n for f in fields]
    return Split(*means)


def measure(rounds: int = 15) -> dict[str, Any]:
    torch.set_num_threads(1)
    demo = DEMO_STEPS["resnet"](seed=0)
    inputs = demo.make_inputs(0)
    runner = WholeStepRunner.capture("resnet", demo.step_fn, inputs, {}, clock=time.time_ns, limit=None,
                                     profiling=False, sample_rate=0, timing="pipelined", device_clock=None)
    leaves = pytree.tree_leaves((inputs, {}))
    marks = Marks()
    plain = marked_graph(runner, marks)
    tiny = TinyCall()
    warmed = marked_graph(runner, marks, tiny)
    for graph, _ in (plain, warmed):  # warm-up steps
        run_captured(runner.captured, graph, leaves, instrumented=True, clock=time.time_ns)
    in_step: list[list[Split]] = []
    in_step_warm: list[list[Split]] = []
    unprofiled: list[list[Split]] = []
    tiny_in_step: list[list[int]] = []
    eager: list[list[tuple[float, float]]] = []
    for _ in range(rounds):
        in_step.append(split_step(runner, leaves, *plain, marks))
        in_step_warm.append(split_step(runner, leaves, *warmed, marks))
        unprofiled.append(unprofiled_step(runner, leaves, *plain, marks))
        tiny.times_ns.clear()
        unprofiled_step(runner, leaves, *warmed, marks)
        tiny_in_step.append(list(tiny.times_ns))
        eager.append(eager_events_ns(demo.step_fn, inputs))
    x = torch.randn(16, 64, 8, 8)
    c = torch.ones(64)
    loop_args = (torch.randn_like(x), x, c, torch.zeros(64), c, torch.zeros(64), c, True, 1e-5, [True, True, True])
    return {
        "in step": _median_split(in_step),
        "in step, warmed": _median_split(in_step_warm),
        "hot loop": hot_loop(loop_args),
        "in step, no profiler": _median_split(unprofiled),
        "eager_event_ns": statistics.mean(statistics.median(r[i][0] for r in eager) for i in range(len(eager[0]))),
        "eager_engine_ns": statistics.mean(statistics.median(r[i][1] for r in eager) for i in range(len(eager[0]))),
        "faults": faults_per_call(runner, leaves),
        "tiny_in_step_ns": statistics.mean(statistics.median(r[i] for r in tiny_in_step)
                                           for i in range(len(tiny_in_step[0]))),
        "tiny_loop_ns": _tiny_loop_ns(tiny),
        "tiny_idle_ns": _tiny_loop_ns(tiny, idle_ns=10_000_000),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| per call, us | graphprof node | Python to the call | entry (to event) | torch.profiler event "
             "| exit (event to return) | frees + probe | node / event |", "|---|---|---|---|---|---|---|---|"]
    for label in ("in step", "in step, warmed", "hot loop"):
        s: Split = result[label]
        parts = (s.node_ns, s.python_ns, s.entry_ns, s.event_ns, s.exit_ns, s.frees_ns)
        lines.append(f"| {label} | " + " | ".join(f"{p / 1e3:.1f}" for p in parts) + f" | {s.node_ns / s.event_ns:.3f} |")
    u: Split = result["in step, no profiler"]
    lines.append(f"\nin step without torch.profiler: node {u.node_ns / 1e3:.1f} us = Python to the call "
                 f"{u.python_ns / 1e3:.1f} + call {u.event_ns / 1e3:.1f} + frees and probe {u.frees_ns / 1e3:.1f}")
    lines.append(f"eager autograd, torch.profiler: op event {result['eager_event_ns'] / 1e3:.1f} us, the engine's "
                 f"event around it {result['eager_engine_ns'] / 1e3:.1f} us per call (mean over nodes of per-node medians)")
    lines.append(f"the op on 2x64x1x1 tensors, no profiler: {result['tiny_in_step_ns'] / 1e3:.1f} us right before each "
                 f"call in the step, {result['tiny_loop_ns'] / 1e3:.1f} us repeated in a loop, "
                 f"{result['tiny_idle_ns'] / 1e3:.1f} us repeated after 10 ms of spinning each")
    lines.append(f"minor page faults per call, in step: {result['faults']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, 1 thread, load {open('/proc/loadavg').read().split()[0]}")
    print(markdown(measure(args.rounds)))


if __name__ == "__main__":
    main()
