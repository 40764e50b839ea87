"""``python -m benchmarks``: every measurement, as one markdown report.

Runs, in one process and one go, on the demo ResNet and GPT training steps,
a deliberately hostile deep MLP of tiny ops, and Hugging Face BERT and GPT-2
steps with AdamW, clipping and a logged loss (hf_workloads.py):

* overhead.py: fidelity (graph / eager), probe overhead, coverage, idle
  schedule cost, segmented capture (GPT), torch.profiler / eager;
* segmented.py: segments with and without probes / eager, on the GPT step
  with a logged loss and a Hugging Face BERT + AdamW step;
* real_loops.py: probes / eager on a scheduler inside and outside the step and
  gradient accumulation with a counter (demo GPT);
* capture_cost.py: graphprof's capture against torch.compile(aot_eager);
* agreement.py: per-op-type time against torch.profiler, top 5 types;
* coverage_threads.py: coverage step by step at 1 and 2 torch threads;
* analyze_scale.py: bytes per node of 10,000 and 100,000-node profiles;
* cli_scale.py: analyze, report, diff and every export of 10,000, 100,000
  and 1,000,000-node profiles, one process each: wall and CPU time, peak RSS
  (``--quick``: 10,000 and 100,000 nodes only).

Writes the report to stdout and to benchmarks/results.md. Use ``--quick`` for
fewer rounds (numbers get noisier).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks import (
    agreement,
    analyze_scale,
    capture_cost,
    coverage_threads,
    hf_workloads,
    overhead,
    real_loops,
    segmented,
)

WORKLOADS = ("resnet", "gpt", "tiny-mlp", *hf_workloads.HF_STEPS)
TARGETS = {"resnet": 1.02, "gpt": 1.05, "tiny-mlp": 1.15, **hf_workloads.TARGETS}
#: Profile sizes of the command rows; the last only in a full run (its trace export alone is gigabytes).
CLI_NODES = (10_000, 100_000, 1_000_000)


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _cli_table(nodes: int, repeat: int) -> list[str]:
    """``cli_scale``'s table lines (header first) for one size, measured by a fresh ``cli_scale`` process.

    Why a process of its own: a command's peak RSS counts the resident memory
    of the process that started it (Linux keeps the high-water mark across
    ``exec``), and this one holds torch and the workloads, over a GiB.
    """
    done = subprocess.run([sys.executable, "-m", "benchmarks.cli_scale", "--nodes", str(nodes), "--repeat", str(repeat)],
                          capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [line for line in done.stdout.splitlines() if line.startswith("|")]


def run(quick: bool) -> str:
    rounds = 8 if quick else 30
    lines = [
        "# graphprof benchmarks",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"load average at start {os.getloadavg()[0]:.2f}. Command: `python -m benchmarks{' --quick' if quick else ''}`.",
        "",
        "## Overhead, fidelity, coverage",
        "",
    ]
    results = [overhead.measure(w, rounds=rounds, segmented=(w == "gpt")) for w in WORKLOADS]
    lines.append(overhead.markdown(results))
    lines.append("")
    for r in results:
        lines.append(f"- {r.workload}: overhead {r.overhead:.3f} (target <= {TARGETS[r.workload]}: "
                     f"{_mark(r.overhead <= TARGETS[r.workload])}), probes/eager {r.probes_vs_eager:.3f} (<= 1.03: "
                     f"{_mark(r.probes_vs_eager <= 1.03)}), fidelity {r.fidelity:.3f} (<= 1.03: "
                     f"{_mark(r.fidelity <= 1.03)}), coverage {r.coverage:.3f} (>= 0.97: {_mark(r.coverage >= 0.97)})")
    lines += ["", "## Real training loops on the demo GPT (probes / eager, interleaved)", "",
              real_loops.markdown([real_loops.measure(loop, rounds=8 if quick else 20) for loop in real_loops.LOOPS])]
    lines += ["", "## Segmented capture (capture=\"dynamo\") on steps that log with .item()", "",
              segmented.markdown([segmented.measure(w, rounds=rounds // 2) for w in segmented.WORKLOADS])]
    lines += ["", "## Capture cost against torch.compile(backend=\"aot_eager\")", "",
              "| workload | graphprof capture | aot_eager compile | ratio |", "|---|---|---|---|"]
    for w in ("resnet", "gpt", "tiny-mlp"):
        c = capture_cost.measure(w, repeat=1 if quick else 3)
        lines.append(f"| {w} | {c.graphprof_s:.2f} s | {c.aot_eager_s:.2f} s | {c.ratio:.2f} ({_mark(c.ratio <= 1.0)}) |")
    lines += ["", "## Agreement with torch.profiler (top 5 op types, same graph, its overhead counted out)", "",
              "| workload | op type | graphprof | torch.profiler | ratio |", "|---|---|---|---|---|"]
    for w in ("resnet", "gpt"):
        rows, per_event = agreement.measure(w, steps=5 if quick else 10)
        for a in rows:
            lines.append(f"| {w} | {a.op_type} | {a.graphprof_s * 1e6:.0f} us | {a.torch_profiler_s * 1e6:.0f} us | "
                         f"{a.ratio:.3f} ({_mark(abs(a.ratio - 1) <= 0.10)}) |")
    lines.append(f"\ntorch.profiler's measured cost per recorded event: {per_event * 1e9:.0f} ns.")
    lines += ["", "## Coverage step by step (node times of step k / wall time of step k), 1 and 2 torch threads", "",
              coverage_threads.markdown([coverage_threads.measure(w, t, steps=10 if quick else 20)
                                         for w in WORKLOADS for t in (1, 2)])]
    lines += ["", "## Profile file size", "", "| nodes | bytes/node/step (5 steps) | bytes/node (1 step) |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as directory:
        for nodes in (10_000, 100_000):
            _, one = analyze_scale.file_size(analyze_scale.synthetic_profile(nodes, 1), directory, "one.json")
            _, five = analyze_scale.file_size(analyze_scale.synthetic_profile(nodes, 5), directory, "five.json")
            lines.append(f"| {nodes} | {five / nodes / 5:.1f} | {one / nodes:.1f} |")
        lines += ["", "## Commands on large profiles (one process each, interpreter start included)", "",
                  "Wall and CPU (user + sys) time, median of runs; peak RSS of the process. Targets: 1.5 s at "
                  "100,000 nodes; analyze, report and diff of 1,000,000 nodes in 15 s and 4 GiB "
                  "(one size: `python -m benchmarks.cli_scale --nodes 1000000`).", ""]
        sizes = CLI_NODES[:2] if quick else CLI_NODES
        tables = [_cli_table(nodes, 1 if quick or nodes >= 1_000_000 else 3) for nodes in sizes]
        lines.append("\n".join([*tables[0][:2], *(row for table in tables for row in table[2:])]))
    lines.append(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    parser.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "results.md"))
    args = parser.parse_args()
    text = run(args.quick)
    print(text)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.output)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, args.output)


if __name__ == "__main__":
    main()
