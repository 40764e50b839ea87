"""Writes a step makes itself: to ``sys.stdout``/``sys.stderr``, and to files.

``sys.stderr.write(".")`` (a progress mark) or ``sys.stdout.write(...)`` in
the step wrote in the capture call only: a replay does not run the step's
Python, and only ``print`` and ``logging`` were made again. A file the step
wrote (held open, or opened in the step) got one line where eager wrote
one per call, silently.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 6


def _make(after: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        after(loss)
        return loss.detach()
    return step


def _calls(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[str]:
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(CALLS):
            fn(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))
    return [str(w.message) for w in caught]


def test_writes_to_sys_streams_are_made_on_every_replay(capsys: pytest.CaptureFixture[str]) -> None:
    def marks(loss: torch.Tensor) -> None:
        sys.stderr.write(".")
        sys.stderr.flush()
        sys.stdout.writelines(["step", "\n"])
        print("loss", loss.item())

    _calls(_make(marks))
    eager = capsys.readouterr()
    traced = graphprof.trace(_make(marks))
    assert _calls(traced) == []
    replayed = capsys.readouterr()
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    assert replayed.err == eager.err == "." * CALLS
    assert replayed.out == eager.out and eager.out.count("step\n") == CALLS
    assert "EchoStream" not in type(sys.stdout).__name__ + type(sys.stderr).__name__  # the streams given back


def test_a_file_the_step_opens_refuses_the_capture(tmp_path: Path) -> None:
    log = tmp_path / "loss.log"

    def append(loss: torch.Tensor) -> None:
        with open(log, "a") as f:
            f.write("step\n")

    traced = graphprof.trace(_make(append))
    messages = _calls(traced)
    assert len(messages) == 1 and "opens a file" in messages[0]
    assert traced.capture_mode == "segments"
    assert log.read_text().count("step\n") == CALLS


def test_a_file_the_step_holds_open_refuses_the_capture(tmp_path: Path) -> None:
    path = tmp_path / "loss.log"
    with open(path, "w") as log:
        traced = graphprof.trace(_make(lambda loss: log.write("step\n")))
        messages = _calls(traced)
    assert len(messages) == 1 and "holds the open file log" in messages[0]
    assert traced.capture_mode == "segments"
    assert path.read_text().count("step\n") == CALLS


def test_output_before_a_refusal_is_printed_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The capture call printed, then was refused later in the step and run again another way, which
    printed the same line a second time."""
    def refused_later(loss: torch.Tensor) -> None:
        print("loss", loss.item())
        sys.stderr.write("!")
        if float(loss) > 1e9:  # float() of a value of the model's: refuses the capture
            print("never")

    _calls(_make(refused_later))
    eager = capsys.readouterr()
    traced = graphprof.trace(_make(refused_later))
    messages = _calls(traced)
    replayed = capsys.readouterr()
    assert len(messages) == 1 and traced.capture_mode == "segments"
    assert replayed.out == eager.out and eager.out.count("\n") == CALLS
    assert replayed.err == eager.err == "!" * CALLS


def test_a_checkpoint_saved_every_other_step_is_saved_every_time(tmp_path: Path) -> None:
    """``torch.save`` behind a counter: the path that saves was captured once, its replays never saved."""
    box = {"n": 0}

    def save_every_other(loss: torch.Tensor) -> None:
        box["n"] += 1
        if box["n"] % 2 == 0:
            torch.save({"loss": loss.detach()}, tmp_path / "last.pt")
            os.replace(tmp_path / "last.pt", tmp_path / f"step{box['n']}.pt")

    traced = graphprof.trace(_make(save_every_other))
    messages = _calls(traced)
    assert len(messages) == 1 and "calls torch.save" in messages[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step{n}.pt" for n in range(2, CALLS + 1, 2)]


def test_a_progress_bar_writing_to_its_own_stream_leaves_no_traced_number_behind() -> None:
    """tqdm keeps its stream (an open file) and numbers (``n``, ``pos``): the refusal came after the numbers
    had been made inputs, which stayed in the bar and broke the step run another way."""
    tqdm = pytest.importorskip("tqdm").tqdm
    import io

    def make() -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], Any]:
        bar = tqdm(total=CALLS, file=io.StringIO(), mininterval=0, miniters=1, ascii=True)
        return _make(lambda loss: bar.update(1)), bar

    (eager, eager_bar), (step, bar) = make(), make()
    _calls(eager)
    traced = graphprof.trace(step)
    messages = _calls(traced)
    assert len(messages) == 1 and "holds the open file bar.fp" in messages[0]
    assert bar.n == eager_bar.n == CALLS and type(bar.pos) is int
    assert bar.fp.getvalue().count("\r") == eager_bar.fp.getvalue().count("\r")


def test_a_branch_on_elapsed_time_is_refused_at_once_with_one_warning() -> None:
    """``if time.perf_counter() - t0 > limit``: a replay cannot know the later reading before it runs.

    Its guard was checked with both clocks read before the step, in reverse
    order, so it failed on every call and the step captured five times
    before it fell back (and a ``capture="fx"`` step raised).
    """
    import time

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    slow: list[bool] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        slow.append(time.perf_counter() - t0 > 3600.0)
        return loss.detach()

    fn = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            fn(torch.full((3, 4), float(i)))
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "depends on the time (time.perf_counter)" in messages[0]
    assert fn.captures == 0 and fn.capture_mode == "segments"
    assert slow == [False] * 6


def test_a_print_to_sys_stderr_goes_to_the_stream_sys_has_at_each_replay() -> None:
    """``print(..., file=sys.stderr)`` keeps graphprof's stand-in for the stream as its argument; once the
    capture was over it wrote to the stream of the capture call, and a caller redirecting stderr per call
    (``contextlib.redirect_stderr``, as a notebook cell or a test does) got nothing."""
    def make() -> Any:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            print("loss %.4f" % loss.item(), file=sys.stderr)
            return loss.detach()
        return step

    eager, traced = make(), graphprof.trace(make())
    for i in range(4):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        expected, got = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(expected):
            eager(x, y)
        with contextlib.redirect_stderr(got):
            traced(x, y)
        assert got.getvalue() == expected.getvalue() != "", f"call {i}"
    assert traced.capture_mode == "whole-step"
