"""On an accelerator: probe overhead, and per-op device times against torch.profiler's kernel times.

Needs a torch.accelerator device (CUDA, ROCm, XPU, ...); without one it says
so and exits with status 2. It ran on an H100 and an H200 (torch 2.11, CUDA
13); their figures are in benchmarks/results.md and the README's Accelerators.

Overhead (interleaved rounds on ONE model and optimizer, as in
``benchmarks.overhead``; each ratio is the median over rounds of per-round
ratios; every round ends with one device synchronisation):

  sync/step    = plain graph with a device sync after every step / plain graph
                 (the part of the overhead that is the profiler's one sync per step)
  pipelined    = graph with host probes and device events, one sync per step / plain graph
  isolated     = graph with a sync after every op (timing="isolated") / plain graph

Agreement: the captured graph's op nodes against torch.profiler's top-level
aten events of the same graph run without probes (``device_time_total``:
the device time of the kernels the op launched, children included). Nodes
and events are paired in execution order by op name (difflib), per step;
each side takes its median over steps. Only pairs whose graphprof device
time is at least ``--min-us`` (50 us) count: below that, launch latency and
event resolution (about 0.5 us) dominate. Both timing modes are compared:
pipelined device time includes any wait for the host, isolated device time
includes the op's own launch latency on an idle device.

Usage: python -m benchmarks.device_agreement [--workload resnet gpt tiny-mlp] [--steps 10] [--rounds 20]
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

import graphprof
from benchmarks.agreement import TypeAgreement  # one (op type, graphprof, torch.profiler) record for both
from graphprof.demo.steps import DEMO_STEPS, DemoStep
from graphprof.runtime.device_clock import device_capability, device_name

#: Sizes that give an accelerator real work (the demo defaults are sized for a CPU test suite).
GPU_SIZES: dict[str, dict[str, Any]] = {
    "resnet": {"batch_size": 128, "image_size": 64},
    "gpt": {"batch_size": 16, "seq_len": 256, "d_model": 512, "n_layer": 4, "n_head": 8, "n_ctx": 256,
            "vocab_size": 4096},
    "tiny-mlp": {},
}


@dataclass(frozen=True)
class OverheadResult:
    workload: str
    plain_ms: float
    sync_per_step: float
    pipelined: float
    isolated: float
    nodes: int


def device() -> torch.device:
    if not torch.accelerator.is_available():
        raise SystemExit("benchmarks.device_agreement needs an accelerator (torch.accelerator finds none)")
    return torch.accelerator.current_accelerator()


def demo_on_device(workload: str, dev: torch.device) -> tuple[DemoStep, list[tuple[Any, ...]]]:
    """The demo step with its model (and so its optimizer's parameters) on ``dev``, and inputs there."""
    demo = DEMO_STEPS[workload](seed=0, **GPU_SIZES.get(workload, {}))
    demo.model.to(dev)
    inputs = [tuple(t.to(dev) for t in demo.make_inputs(i)) for i in range(4)]
    return demo, inputs


def _activity(dev: torch.device) -> ProfilerActivity:
    names = {"cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
    return getattr(ProfilerActivity, names.get(dev.type, "PrivateUse1"))


def _round(fn: Callable[..., Any], inputs: list[tuple[Any, ...]], steps: int, sync_each: bool) -> float:
    torch.accelerator.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        fn(*inputs[i % len(inputs)])
        if sync_each:
            torch.accelerator.synchronize()
    torch.accelerator.synchronize()
    return time.perf_counter() - t0


def measure_overhead(workload: str, rounds: int = 20, steps_per_round: int = 5) -> OverheadResult:
    dev = device()
    demo, inputs = demo_on_device(workload, dev)
    pipelined = graphprof.trace(demo.step_fn)
    isolated = graphprof.trace(demo.step_fn, timing="isolated")
    for fn in (pipelined, isolated):
        for i in range(4):
            fn(*inputs[i])  # eager, capture, and both executables compiled
        fn.profiling = False
        fn(*inputs[0])
        fn.profiling = True
    ratios: dict[str, list[float]] = defaultdict(list)
    plain_times = []
    for _ in range(rounds):
        pipelined.profiling = False
        plain = _round(pipelined, inputs, steps_per_round, False)
        synced = _round(pipelined, inputs, steps_per_round, True)
        pipelined.profiling = True
        probed = _round(pipelined, inputs, steps_per_round, False)
        exact = _round(isolated, inputs, steps_per_round, False)
        plain_times.append(plain / steps_per_round)
        ratios["sync"].append(synced / plain)
        ratios["pipelined"].append(probed / plain)
        ratios["isolated"].append(exact / plain)
    nodes = len(pipelined.get_profile().graphs[0].nodes)
    return OverheadResult(workload, 1e3 * statistics.median(plain_times), statistics.median(ratios["sync"]),
                          statistics.median(ratios["pipelined"]), statistics.median(ratios["isolated"]), nodes)


def _profiler_name(op: str) -> str:
    """``aten.addmm.default`` -> ``aten::addmm`` (torch.profiler's event name)."""
    parts = op.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else op


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0))


def _profiler_steps(fn: Callable[..., Any], inputs: list[tuple[Any, ...]], steps: int,
                    dev: torch.device) -> list[list[tuple[str, float]]]:
    """Per step, the top-level aten events of the plain graph: (name, device seconds), in order."""
    out: list[list[tuple[str, float]]] = []
    for i in range(steps):
        torch.accelerator.synchronize()
        with profile(activities=list({ProfilerActivity.CPU, _activity(dev)})) as prof:
            fn(*inputs[i % len(inputs)])
            torch.accelerator.synchronize()
        events = [e for e in prof.events() if e.name.startswith("aten::")
                  and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
        events.sort(key=lambda e: e.time_range.start)
        out.append([(e.name, _device_us(e) * 1e-6) for e in events])
    return out


def measure_agreement(workload: str, steps: int = 10, timing: str = "pipelined",
                      min_s: float = 50e-6) -> list[TypeAgreement]:
    """Pairs (graphprof node, torch.profiler event) of the same graph whose device time is >= ``min_s``."""
    dev = device()
    demo, inputs = demo_on_device(workload, dev)
    fn = graphprof.trace(demo.step_fn, timing=timing)
    for i in range(2 + steps):
        fn(*inputs[i % len(inputs)])
    nodes = [n for n in fn.get_profile().graphs[0].nodes if n.op.startswith("aten.") and n.device_time_s]
    ours = [(_profiler_name(n.op), n.type, statistics.median(n.device_time_s)) for n in nodes]
    fn.profiling = False
    per_step = _profiler_steps(fn, inputs, steps, dev)
    theirs_names = [name for name, _ in per_step[0]]
    theirs_times = [statistics.median(step[j][1] for step in per_step if len(step) > j and step[j][0] == name)
                    for j, name in enumerate(theirs_names)]
    matcher = difflib.SequenceMatcher(a=[name for name, _, _ in ours], b=theirs_names, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            _, op_type, seconds = ours[block.a + k]
            if seconds >= min_s:
                pairs.append(TypeAgreement(op_type, seconds, theirs_times[block.b + k]))
    return pairs


def summary(pairs: list[TypeAgreement]) -> str:
    if not pairs:
        return "no node above the threshold"
    ratios = sorted(p.ratio for p in pairs)
    within = sum(1 for r in ratios if abs(r - 1) <= 0.10)
    return (f"{len(pairs)} nodes: median ratio {statistics.median(ratios):.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}, "
            f"{within}/{len(pairs)} within 10%")


def by_type(pairs: list[TypeAgreement]) -> list[TypeAgreement]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for p in pairs:
        sums[p.op_type][0] += p.graphprof_s
        sums[p.op_type][1] += p.torch_profiler_s
    return sorted((TypeAgreement(k, a, b) for k, (a, b) in sums.items()), key=lambda p: -p.graphprof_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["resnet", "gpt", "tiny-mlp"], choices=sorted(DEMO_STEPS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--min-us", type=float, default=50.0)
    args = parser.parse_args()
    if not torch.accelerator.is_available():
        print("benchmarks.device_agreement: no accelerator (torch.accelerator finds none); nothing measured",
              file=sys.stderr)
        raise SystemExit(2)
    dev = device()
    print(f"device: {dev} ({device_name(str(dev))}, {device_capability(str(dev)) or 'capability unknown'}), "
          f"torch {torch.__version__}\n")
    print("| workload | nodes | plain step | sync/step | pipelined | isolated |\n|---|---|---|---|---|---|")
    for w in args.workload:
        r = measure_overhead(w, rounds=args.rounds)
        print(f"| {w} | {r.nodes} | {r.plain_ms:.2f} ms | {r.sync_per_step:.3f} | {r.pipelined:.3f} | {r.isolated:.3f} |")
    print(f"\nAgreement with torch.profiler's device time per op (nodes >= {args.min_us:.0f} us)\n")
    print("| workload | timing | op type | graphprof | torch.profiler | ratio |\n|---|---|---|---|---|---|")
    notes = []
    for w in args.workload:
        for timing in ("pipelined", "isolated"):
            pairs = measure_agreement(w, args.steps, timing, args.min_us * 1e-6)
            notes.append(f"- {w}, {timing}: {summary(pairs)}")
            for p in by_type(pairs)[:5]:
                print(f"| {w} | {timing} | {p.op_type} | {p.graphprof_s * 1e6:.0f} us | "
                      f"{p.torch_profiler_s * 1e6:.0f} us | {p.ratio:.3f} |")
    print("\nPer node:\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
