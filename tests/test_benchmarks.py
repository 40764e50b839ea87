"""The benchmark pieces `python -m benchmarks` is made of run, on sizes small enough for the suite."""

from __future__ import annotations

from pathlib import Path

import torch

import graphprof
from benchmarks import cli_scale
from benchmarks.__main__ import CLI_NODES, WORKLOADS
from benchmarks.hf_workloads import HF_STEPS, workload_step


def test_cli_rows_cover_every_command_with_time_and_peak_memory(tmp_path: Path) -> None:
    rows = cli_scale.measure(300, str(tmp_path), repeat=1, steps=2)
    commands = [r.command for r in rows]
    assert commands == ["analyze", "report", "diff", *(f"export {name}" for name, _ in cli_scale.EXPORTS)]
    assert all(r.wall_median_s > 0 and r.cpu_median_s > 0 and r.peak_rss_bytes > 2**20 for r in rows)
    assert "| 300 | export graphml |" in cli_scale.markdown(rows)
    assert CLI_NODES == (10_000, 100_000, 1_000_000)


def test_hugging_face_workloads_are_benchmarked_and_profiling_keeps_their_losses() -> None:
    assert set(HF_STEPS) <= set(WORKLOADS)
    eager, traced = workload_step("hf-gpt2", seed=0), workload_step("hf-gpt2", seed=0)
    fn = graphprof.trace(traced.step_fn, profiling=True)
    for i in range(4):  # eager call, capture, replays; each pair draws the same dropout masks
        torch.manual_seed(100 + i)
        expected = eager.step_fn(*eager.make_inputs(i))
        torch.manual_seed(100 + i)
        assert torch.equal(expected, fn(*traced.make_inputs(i)))
    for a, b in zip(eager.model.parameters(), traced.model.parameters()):
        assert torch.equal(a, b)
    assert fn.get_profile().node_count > 100
