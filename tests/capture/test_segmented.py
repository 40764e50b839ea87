"""Segmented capture (torch.compile + AOTAutograd) for steps one static trace cannot hold.

Each test runs a step eagerly and under capture="auto" (which falls back to
segments) on identical copies, and compares results. Tolerance: bitwise on CPU
for these steps; AOTAutograd's graphs are functionalised, so where a test
needs a tolerance it says so.
"""

from __future__ import annotations

import logging

import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import record_function

import graphprof
from graphprof.profile.model import GraphKind, Phase


def _mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _inputs(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


def item_logging(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        sys.stdout.write(f"loss {loss.item():.4f}\n")  # not print: the replay would format that
        opt.step()
        return loss
    return step


def numpy_round_trip(model, opt):
    def step(x, y):
        opt.zero_grad()
        clipped = torch.from_numpy(np.clip(x.numpy(), -1.0, 1.0))
        loss = nn.functional.mse_loss(model(clipped), y)
        loss.backward()
        opt.step()
        return loss
    return step


def data_dependent_branch(model, opt):
    def step(x, y):
        opt.zero_grad()
        out = model(x)
        if out.mean() > 0:  # Python control flow on a tensor value
            out = out * 2
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        return loss
    return step


def clip_with_printed_norm(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        sys.stdout.write(f"grad norm {norm:.3f}\n")  # not print: the replay would format that
        opt.step()
        return loss
    return step


STEPS = [item_logging, numpy_round_trip, data_dependent_branch, clip_with_printed_norm]


def _run(make_step, traced: bool, n: int = 7):
    model, opt = _mlp()
    step = make_step(model, opt)
    fn = graphprof.trace(step) if traced else step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [fn(*_inputs(i)).detach().clone() for i in range(n)]
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    return losses, model, opt, fn, messages


@pytest.mark.parametrize("make_step", STEPS, ids=lambda f: f.__name__)
def test_auto_falls_back_to_segments_with_eager_results(make_step, capsys) -> None:
    eager_losses, eager_model, _, _, _ = _run(make_step, traced=False)
    losses, model, _, fn, messages = _run(make_step, traced=True)
    assert len(messages) == 1 and "torch.compile segments" in messages[0]
    assert "test_segmented.py:" in messages[0]  # names the user's source line
    for a, b in zip(eager_losses, losses):
        assert torch.equal(a, b)  # bitwise on CPU for these steps
    for p, q in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(p, q)
    profile = fn.get_profile()
    assert profile.meta.capture == "dynamo"
    kinds = {g.kind for g in profile.graphs}
    assert GraphKind.FORWARD in kinds and GraphKind.BACKWARD in kinds
    # nodes plus host gaps account for the step's wall time
    for i, step in enumerate(profile.steps):
        covered = sum(n.host_time_s[i] for _, n in profile.iter_nodes())
        assert covered / step.wall_time_s >= 0.95
    phases = {n.phase for _, n in profile.iter_nodes()}
    assert {Phase.FORWARD, Phase.BACKWARD} <= phases


def test_segments_carry_module_and_phase() -> None:
    _, _, _, fn, _ = _run(item_logging, traced=True)
    profile = fn.get_profile()
    forward = next(g for g in profile.graphs if g.kind is GraphKind.FORWARD)
    addmm = [n for n in forward.nodes if n.type == "addmm"]
    assert {n.module for n in addmm} == {"0", "2"} and {n.module_type for n in addmm} == {"Linear"}
    backward = next(g for g in profile.graphs if g.kind is GraphKind.BACKWARD)
    assert {n.module_type for n in backward.nodes if n.type == "mm"} == {"Linear"}
    optimizer = [n for _, n in profile.iter_nodes() if n.phase is Phase.OPTIMIZER]
    assert optimizer  # the optimizer's graph is recognised from its stack trace
    reads = [n for _, n in profile.iter_nodes() if n.op == "Tensor.item"]
    assert reads and all("test_segmented.py" in n.source for n in reads)


class TutorialModule(nn.Module):
    """The PyTorch profiler recipe's module: a linear layer, then host work on its output."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        with record_function("LINEAR PASS"):
            out = self.linear(x)
        with record_function("MASK INDICES"):
            threshold = out.sum(axis=1).mean().item()
            hi_idx = np.argwhere(mask.cpu().numpy() > threshold)
            hi_idx = torch.from_numpy(hi_idx)
        return out, hi_idx


def test_tutorial_pattern_shows_host_sync_and_copies() -> None:
    torch.manual_seed(0)
    module = TutorialModule(64, 8)
    x, mask = torch.rand(32, 64), torch.rand(32, 8)
    fn = graphprof.trace(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [fn(x, mask) for _ in range(4)]
    expected = module(x, mask)
    assert torch.equal(results[-1][0], expected[0]) and torch.equal(results[-1][1], expected[1])
    profile = fn.get_profile()
    reads = {n.type: n for _, n in profile.iter_nodes() if n.op.startswith("Tensor.")}
    assert "item" in reads  # the host synchronisation
    assert "numpy" in reads or "cpu" in reads  # the copy to host memory
    assert all("test_segmented.py" in n.source for n in reads.values())
    linear = [n for _, n in profile.iter_nodes() if n.type == "addmm"]
    assert linear and linear[0].module == "linear"


def test_explicit_dynamo_mode_and_profiling_false() -> None:
    model, opt = _mlp()
    fn = graphprof.trace(item_logging(model, opt), capture="dynamo", profiling=False)
    for i in range(4):
        fn(*_inputs(i))
    with pytest.raises(RuntimeError, match="no profiled step"):
        fn.get_profile()


def test_recompiles_after_the_first_call_warn_once() -> None:
    """A number dynamo specialised on (a shift that changes every call) recompiles the forward on every
    call: one warning says so, and the later compiles are logged."""
    class Shift(nn.Module):
        def forward(self, x, k):
            return x.roll(k, 0) * 2

    model = Shift()
    fn = graphprof.trace(lambda x, k: model(x, k), capture="dynamo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(1, 6):
            assert torch.equal(fn(torch.arange(4.0), k), torch.arange(4.0).roll(k, 0) * 2)
    recompiles = [str(w.message) for w in caught if "after the first call" in str(w.message)]
    assert len(recompiles) == 1 and "later compiles are logged" in recompiles[0], recompiles


def test_a_step_that_fell_back_warns_once_and_logs_its_recompiles(caplog: pytest.LogCaptureFixture) -> None:
    """In ``auto`` mode the step runs as segments only after one warning saying why; a forward dynamo
    compiles again later is logged, not a second warning."""
    class Shift(nn.Module):
        def forward(self, x, k):
            return x.roll(k, 0) * 2

    model = Shift()

    def step(x, k):
        y = model(x, k)
        return y + 1 if torch.rand([]) < 0.5 else y  # a branch on a random draw: no static graph

    fn = graphprof.trace(step)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="graphprof"):
        warnings.simplefilter("always")
        for k in range(1, 6):
            torch.manual_seed(k)
            expected = step(torch.arange(4.0), k)
            torch.manual_seed(k)
            assert torch.equal(fn(torch.arange(4.0), k), expected)
    assert fn.capture_mode == "segments"
    warned = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(warned) == 1 and "cannot capture" in warned[0], warned
    assert any("after the first call" in r.getMessage() for r in caplog.records)
