"""A compiled forward called without dynamo's frame entry runs only while dynamo's guards hold.

Each case runs a step eagerly and under ``capture="dynamo"`` on identical
copies; after the change (a new batch size, a frozen parameter, eval mode,
grad mode off) the call must go through dynamo (a recompile, never the stale
graph) and every result must stay bitwise equal to eager's.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphprof
from graphprof.capture.dynamo_entry import DirectEntry
from graphprof.profile.model import GraphKind
from tests.helpers import assert_modules_equal


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _step(model: nn.Module, opt: torch.optim.Optimizer, logs: list[float]):
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if loss.requires_grad:
            loss.backward()
            opt.step()
        logs.append(loss.item())
        return loss.detach()
    return step


def _batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randn(n, 2, generator=g)


def _freeze(model: nn.Module) -> None:
    model[0].weight.requires_grad_(False)


def _eval(model: nn.Module) -> None:
    model.eval()


CHANGES = {
    "batch size": (None, 5),
    "requires_grad": (_freeze, 4),
    "train/eval": (_eval, 4),
    "grad mode": ("no_grad", 4),
}


def _entry(traced: graphprof.trace) -> DirectEntry:
    (_, entry), = traced.runner.capture.modules
    assert isinstance(entry, DirectEntry)
    return entry


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_failing_guard_goes_through_dynamo_and_results_stay_bitwise(change: str) -> None:
    what, batch_after = CHANGES[change]
    eager_model = _model()
    seg_model = copy.deepcopy(eager_model)
    eager_logs: list[float] = []
    seg_logs: list[float] = []
    eager_opt = torch.optim.Adam(eager_model.parameters(), lr=1e-2)
    seg_opt = torch.optim.Adam(seg_model.parameters(), lr=1e-2)
    eager = _step(eager_model, eager_opt, eager_logs)
    traced = graphprof.trace(_step(seg_model, seg_opt, seg_logs), capture="dynamo")

    def both(x: torch.Tensor, y: torch.Tensor, changed: bool = False) -> None:
        if changed and what == "no_grad":
            with torch.no_grad():
                expected, got = eager(x, y), traced(x, y)
        else:
            expected, got = eager(x, y), traced(x, y)
        assert torch.equal(expected, got)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(4):
            both(*_batch(4, i))
        entry = _entry(traced)
        direct = entry.direct_calls
        assert direct >= 1  # steady calls skip dynamo's frame entry
        if callable(what):
            what(eager_model)
            what(seg_model)
        recompiles = len(traced.runner.recompiles)
        both(*_batch(batch_after, 10), changed=True)
        assert entry.direct_calls == direct  # the guard failed: dynamo ran (and compiled) it
        assert len(traced.runner.recompiles) > recompiles
        for i in range(3):  # two cached graphs now: dynamo chooses, every time
            both(*_batch(batch_after, 11 + i), changed=True)
        assert entry.direct_calls == direct
    assert eager_logs == seg_logs
    for a, b in zip(eager_model.state_dict().values(), seg_model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(eager_model.parameters(), seg_model.parameters()):
        assert (a.grad is None) == (b.grad is None)
        assert a.grad is None or torch.equal(a.grad, b.grad)


class _Breaks(nn.Module):
    """A forward with a graph break: its transformed code calls a resume function dynamo must compile."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        scale = 2.0 if h.sum().item() > 0 else 0.5
        return self.b(h * scale)


def test_a_forward_with_a_graph_break_always_goes_through_dynamo() -> None:
    eager_model = _Breaks()
    seg_model = copy.deepcopy(eager_model)
    eager_logs: list[float] = []
    seg_logs: list[float] = []
    eager = _step(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1), eager_logs)
    traced = graphprof.trace(_step(seg_model, torch.optim.SGD(seg_model.parameters(), lr=0.1), seg_logs),
                             capture="dynamo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(6):
            x, y = _batch(4, i)
            assert torch.equal(eager(x, y), traced(x, y))
    assert _entry(traced).direct_calls == 0
    assert eager_logs == seg_logs
    for a, b in zip(eager_model.parameters(), seg_model.parameters()):
        assert torch.equal(a, b)


def test_a_non_default_stance_goes_through_dynamo() -> None:
    model = _model()
    logs: list[float] = []
    traced = graphprof.trace(_step(model, torch.optim.SGD(model.parameters(), lr=0.1), logs), capture="dynamo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            traced(*_batch(4, i))
        entry = _entry(traced)
        direct = entry.direct_calls
        with torch.compiler.set_stance("force_eager"):
            traced(*_batch(4, 5))
    assert entry.direct_calls == direct


def test_an_invalidated_cache_entry_goes_through_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo invalidates an entry whose guarded object died by giving it guards that pass anything."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    import graphprof.capture.dynamo_entry as dynamo_entry

    model = _model()
    logs: list[float] = []
    traced = graphprof.trace(_step(model, torch.optim.SGD(model.parameters(), lr=0.1), logs), capture="dynamo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            traced(*_batch(4, i))
    entry = _entry(traced)
    direct = entry.direct_calls
    (real,) = dynamo_entry._debug_get_cache_entry_list(entry._code)

    class Invalidated:
        code = real.code
        guard_manager = DeletedGuardManagerWrapper("a guarded object was deallocated")

    assert Invalidated.guard_manager.check({})  # what running it would have trusted
    monkeypatch.setattr(dynamo_entry, "_debug_get_cache_entry_list", lambda code: [Invalidated()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced(*_batch(4, 7))
    assert entry.direct_calls == direct


class _Criterion(nn.Module):
    """A loss module given the model to call (fairseq's ``criterion(model, sample)``)."""

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(model(x), y)


def test_a_module_called_from_another_compiled_forward_is_inlined_without_a_break_or_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo compiling the criterion's forward meets the model's entry: it must inline the model's
    forward, not trace graphprof's checks (a graph break, and a warning of dynamo's eager never gives)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())  # dynamo warns once per process
    eager_model = _model()
    seg_model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    seg_opt = torch.optim.SGD(seg_model.parameters(), lr=0.1)
    criterion = _Criterion()

    def make(model: nn.Module, opt: torch.optim.Optimizer):
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = criterion(model, x, y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    eager = make(eager_model, eager_opt)
    traced = graphprof.trace(make(seg_model, seg_opt), capture="dynamo")
    breaks = sum(counters["graph_break"].values())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x, y = _batch(4, i)
            assert torch.equal(eager(x, y), traced(x, y))
    assert [str(w.message) for w in caught if not str(w.message).startswith("graphprof")] == []
    assert sum(counters["graph_break"].values()) == breaks
    capture = traced.runner.capture
    forwards = [s.name for s in capture.segments if s.kind is GraphKind.FORWARD]
    assert len(forwards) == 1 and "_Criterion" in forwards[0]  # one graph, the model's ops in it
    entries = {type(module).__name__: entry for module, entry in capture.modules}
    assert entries["_Criterion"].direct_calls >= 1  # and its entry still runs it directly
    for a, b in zip(eager_model.state_dict().values(), seg_model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(eager_model.parameters(), seg_model.parameters()):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)


def test_a_forward_that_raises_its_own_error_raises_it_as_eager_does(capfd: pytest.CaptureFixture[str]) -> None:
    """A batch of the wrong width (a shape bug, or one bad batch among good ones) fails while dynamo traces
    the forward on fake tensors: the caller got dynamo's ``TorchRuntimeError`` with the meta kernel's
    message, and a traceback on stderr, where eager raises ``RuntimeError: mat1 and mat2 shapes cannot be
    multiplied``. Every call's error, result and parameters equal eager's, and nothing more is printed."""
    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(x).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step

    (eager_model, eager), (model, step) = make(), make()
    traced = graphprof.trace(step, capture="dynamo")
    widths = [8, 6, 8, 6, 6, 8]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for i, width in enumerate(widths):
            x = torch.randn(4, width, generator=torch.Generator().manual_seed(i))
            outcomes = []
            for fn in (eager, traced):
                try:
                    outcomes.append(fn(x))
                except Exception as exc:  # the step's own error, compared below
                    outcomes.append(exc)
            expected, got = outcomes
            if isinstance(expected, Exception):
                assert type(got) is type(expected) and str(got) == str(expected), f"call {i}: {got!r}"
            else:
                assert torch.equal(expected, got), f"call {i}"
            assert_modules_equal(eager_model, model, f"after call {i}")
    assert capfd.readouterr().err == ""
