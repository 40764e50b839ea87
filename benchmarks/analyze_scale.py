"""How `graphprof analyze` scales: a synthetic profile of 100,000 nodes (and 10,000).

For each size it writes a synthetic profile shaped like a transformer training
step (repeated blocks of matmuls, norms, elementwise and optimizer ops, with
module paths, source lines, scopes, FLOPs, bytes, memory records and host
times), then measures

* the whole command, interpreter start included: ``sys.executable -m graphprof
  analyze FILE -t 20`` in a subprocess, repeated; median and min wall time,
  and median CPU time (user + sys), which other load on the machine disturbs
  less. Target: <= 1.5 s at 100,000 nodes.
* the file size per node per profiled step, at 1 profiled step (the worst
  case: per-node annotations dominate) and at the chosen number of steps.
  Target: <= 300 bytes.

Usage: python -m benchmarks.analyze_scale [--nodes 100000 10000] [--steps 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from graphprof.profile.records import seconds_to_ns
from graphprof.profile.model import (
    GraphKind, GraphRecord, MemoryRecord, NodeRecord, Phase, Profile, ProfileMeta, StepRecord,
)

#: One transformer block's ops in the forward pass: (op, module suffix, module type, FLOP factor).
_BLOCK = (
    ("aten.native_layer_norm.default", "ln_1", "LayerNorm", 5),
    ("aten.addmm.default", "attn.qkv", "Linear", 6 * 768),
    ("aten.view.default", "attn", "CausalSelfAttention", 0),
    ("aten._scaled_dot_product_flash_attention.default", "attn", "CausalSelfAttention", 4 * 256),
    ("aten.addmm.default", "attn.proj", "Linear", 2 * 768),
    ("aten.add.Tensor", "", "Block", 1),
    ("aten.native_layer_norm.default", "ln_2", "LayerNorm", 5),
    ("aten.addmm.default", "mlp.fc", "Linear", 8 * 768),
    ("aten.gelu.default", "mlp.act", "GELU", 8),
    ("aten.addmm.default", "mlp.proj", "Linear", 8 * 768),
    ("aten.add.Tensor", "", "Block", 1),
)
_BACKWARD = {"aten.addmm.default": ("aten.mm.default", 2), "aten.native_layer_norm.default":
             ("aten.native_layer_norm_backward.default", 1), "aten.gelu.default": ("aten.gelu_backward.default", 1),
             "aten._scaled_dot_product_flash_attention.default":
             ("aten._scaled_dot_product_flash_attention_backward.default", 1),
             "aten.add.Tensor": ("aten.add.Tensor", 1), "aten.view.default": ("aten.view.default", 1)}
_SHAPES = (((8, 256, 768),), ((8, 256, 768), (768,), (768,)), ((2304,), (2048, 768), (768, 2304)),
           ((8, 12, 256, 64), (8, 12, 256, 64), (8, 12, 256, 64)), ((3072,), (2048, 768), (768, 3072)))


def synthetic_profile(nodes: int, steps: int, seed: int = 0) -> Profile:
    """A profile of ``nodes`` nodes: forward blocks, their backward, then optimizer ops."""
    rng = random.Random(seed)
    records: list[NodeRecord] = []
    live = 500 << 20
    per_block = len(_BLOCK)
    fwd_nodes = nodes * 2 // 5
    bwd_nodes = nodes * 2 // 5
    for i in range(nodes):
        if i < fwd_nodes:
            phase, (op, suffix, mtype, factor) = Phase.FORWARD, _BLOCK[i % per_block]
            block = i // per_block
        elif i < fwd_nodes + bwd_nodes:
            j = fwd_nodes + bwd_nodes - 1 - i
            phase, (op, suffix, mtype, factor) = Phase.BACKWARD, _BLOCK[j % per_block]
            op, mult = _BACKWARD[op]
            factor *= mult
            block = j // per_block
        else:
            phase, op, suffix, mtype, factor = Phase.OPTIMIZER, "aten._foreach_add_.List", "mlp.fc", "Linear", 3
            block = (i - fwd_nodes - bwd_nodes) % max(fwd_nodes // per_block, 1)
        module = f"transformer.h.{block}" + (f".{suffix}" if suffix else "")
        numel = 8 * 256 * 768
        alloc = rng.choice((0, numel * 4, numel * 2))
        freed = rng.choice((0, numel * 4))
        live = max(live + alloc - freed, 0)
        base = factor * 2e-11 + 3e-6
        records.append(NodeRecord(
            id=i, name=f"{op.split('.')[1]}_{i}", op=op, type=op.split(".")[1],
            inputs=(i - 1,) if i else (), in_shapes=_SHAPES[i % len(_SHAPES)],
            in_dtypes=("float32",) * len(_SHAPES[i % len(_SHAPES)]), out_shapes=((8, 256, 768),),
            out_dtypes=("float32",), module=module, module_type=mtype, source=f"model.py:{40 + i % per_block}",
            phase=phase, scope="Optimizer.step#AdamW.step" if phase is Phase.OPTIMIZER else "",
            is_view=op == "aten.view.default", flops=factor * numel if factor else 0,
            bytes_read=numel * 4, bytes_written=numel * 4,
            memory=MemoryRecord(allocated_bytes=alloc, freed_bytes=freed, live_bytes=live,
                                live_by_category_bytes={"parameters": 500 << 20, "activations": live - (500 << 20)}),
            host_time_ns=seconds_to_ns(tuple(round(base * rng.uniform(0.8, 1.3), 9) for _ in range(steps))),
        ))
    meta = ProfileMeta(function="train_step", device_type="cpu", device_name="synthetic")
    return Profile(meta=meta, steps=tuple(StepRecord(index=s + 2, wall_time_s=1.0) for s in range(steps)),
                   graphs=(GraphRecord(id=0, name="step", kind=GraphKind.STEP, nodes=tuple(records)),))


@dataclass(frozen=True)
class ScaleResult:
    nodes: int
    steps: int
    bytes_per_node_step: float
    bytes_per_node_one_step: float
    analyze_median_s: float
    analyze_min_s: float
    cpu_median_s: float
    report_median_s: float


def file_size(profile: Profile, directory: str, name: str) -> tuple[str, int]:
    path = os.path.join(directory, name)
    profile.save(path)
    return path, os.path.getsize(path)


def measure(nodes: int, steps: int, repeat: int, directory: str) -> ScaleResult:
    """Write the profiles, time the analyze command ``repeat`` times."""
    _, one_step_size = file_size(synthetic_profile(nodes, 1), directory, f"scale_{nodes}_1.json")
    path, size = file_size(synthetic_profile(nodes, steps), directory, f"scale_{nodes}_{steps}.json")
    times, cpu_times, report_times = [], [], []
    command = [sys.executable, "-m", "graphprof", "analyze", path, "-t", "20"]
    report = [sys.executable, "-m", "graphprof", "report", path, "--peak-gflops", "100", "--peak-gbs", "20"]
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        t0 = time.perf_counter()
        subprocess.run(report, check=True, stdout=subprocess.DEVNULL)
        report_times.append(time.perf_counter() - t0)
    return ScaleResult(nodes=nodes, steps=steps, bytes_per_node_step=size / nodes / steps,
                       bytes_per_node_one_step=one_step_size / nodes, analyze_median_s=statistics.median(times),
                       analyze_min_s=min(times), cpu_median_s=statistics.median(cpu_times),
                       report_median_s=statistics.median(report_times))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100_000, 10_000])
    parser.add_argument("--steps", type=int, default=5, help="profiled steps in the timed profile (default 5)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the command per size (default 5)")
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; `graphprof analyze FILE -t 20` as a subprocess")
    print(f"{'nodes':>8} {'steps':>5} {'B/node/step':>12} {'B/node (1 step)':>16} {'wall median':>12} {'min':>7} "
          f"{'CPU median':>11} {'report median':>14}")
    with tempfile.TemporaryDirectory() as directory:
        for nodes in args.nodes:
            r = measure(nodes, args.steps, args.repeat, directory)
            print(f"{r.nodes:>8} {r.steps:>5} {r.bytes_per_node_step:>12.1f} {r.bytes_per_node_one_step:>16.1f} "
                  f"{r.analyze_median_s:>11.3f}s {r.analyze_min_s:>6.3f}s {r.cpu_median_s:>10.3f}s "
                  f"{r.report_median_s:>13.3f}s")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())} (wall time suffers on a busy machine; "
          "CPU time = user + sys of the command)")


if __name__ == "__main__":
    main()
