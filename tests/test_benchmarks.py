"""The benchmark pieces `python -m benchmarks` is made of run, on sizes small enough for the suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import graphprof
from benchmarks import cli_scale, guard_checks, logged_steps
from benchmarks.__main__ import CLI_NODES, WORKLOADS
from benchmarks.hf_workloads import HF_STEPS, workload_step


def test_cli_rows_cover_every_command_with_time_and_peak_memory(tmp_path: Path) -> None:
    rows = cli_scale.measure(300, str(tmp_path), repeat=1, steps=2)
    commands = [r.command for r in rows]
    assert commands == ["analyze", "report", "diff", *(f"export {name}" for name, _ in cli_scale.EXPORTS), "reference"]
    assert all(r.wall_median_s > 0 and r.cpu_median_s > 0 and r.peak_rss_bytes > 2**20 for r in rows)
    assert "| 300 | export graphml |" in cli_scale.markdown(rows)
    assert CLI_NODES == (10_000, 100_000, 1_000_000)


def test_exports_are_timed_writing_a_new_file_unless_overwrite_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first export and a replacing one differ by the filesystem's flush on rename: each is timed as asked."""
    existed: list[bool] = []
    real = cli_scale.run_once

    def spy(argv: list[str], fresh: str | None = None) -> tuple[float, float, int]:
        out = argv[argv.index("-o") + 1]
        if fresh is not None and os.path.exists(fresh):
            os.remove(fresh)
        existed.append(os.path.exists(out))
        return real(argv)

    monkeypatch.setattr(cli_scale, "run_once", spy)
    cli_scale.measure(200, str(tmp_path), repeat=2, steps=2, commands=("export dot",))
    assert existed == [False, False]
    existed.clear()
    (tmp_path / "second").mkdir()
    cli_scale.measure(200, str(tmp_path / "second"), repeat=2, steps=2, commands=("export dot",), overwrite=True)
    assert existed == [False, True, True]  # one untimed run makes the file the two timed runs replace


def test_commands_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command's first run, then each one's second: a burst of load slows runs of several commands."""
    order: list[str] = []
    monkeypatch.setattr(cli_scale, "run_once", lambda argv, fresh=None: (order.append(argv[3]), (1.0, 1.0, 2**21))[1])
    rows = cli_scale.measure(200, str(tmp_path), repeat=2, steps=2, commands=("analyze", "report"))
    assert order == ["analyze", "report", "analyze", "report"]
    assert [r.command for r in rows] == ["analyze", "report"]


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


def test_guard_check_rows_time_an_eager_and_a_replayed_foreach_radam_step() -> None:
    row = guard_checks.measure(layers=3, rounds=1, calls=1, warm=4)
    assert row.layers == 3 and row.eager_ms > 0 and row.replay_ms > 0
    assert "| 3 |" in guard_checks.markdown([row])


def test_logged_step_rows_time_eager_and_traced_and_count_the_whole_step_calls() -> None:
    printed = logged_steps.measure(every=3, rounds=1, periods=1, sink="print")
    assert printed.every == 3 and printed.eager_ms > 0 and printed.traced_ms > 0
    assert printed.whole_step_share == 1  # the replay formats the printed loss
    written = logged_steps.measure(every=3, rounds=1, periods=1, sink="write")
    assert written.whole_step_share == 2 / 3  # the logging call of each period runs as segments
    assert "| sys.stdout.write | 3 calls |" in logged_steps.markdown([printed, written])
