"""A step with ``torch.amp.GradScaler`` replays one whole-step graph, equal to eager, overflows included.

The graph follows the path of a call whose gradients are finite (the
optimizer steps); a check at the scaler's branch stops a replay whose
gradients overflowed before it changes anything, and that call runs
eagerly: the step skipped, the scale backed off (capture/grad_scaler.py).
Each loop runs eagerly and traced on identical copies, with an overflowing
batch (an infinite input) in the middle, a growth interval of 2 so that the
scale grows too, and everything compared bitwise after every call.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.module_structure import MODULE_GLOBAL_HOOK_DICTS
from graphprof.tracing.fallbacks import CALL_ONLY_LIMIT

#: The calls whose batch holds an infinite value: the scaler skips the optimizer's step there.
OVERFLOWING = (4,)


def _batch(i: int, overflowing: tuple[int, ...] = OVERFLOWING) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 1, generator=g)
    if i in overflowing:
        x[0, 0] = float("inf")
    return x, y


_OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adam foreach": lambda params: torch.optim.Adam(params, lr=0.01, foreach=True),
    "adamw for-loop": lambda params: torch.optim.AdamW(params, lr=0.01, foreach=False),
    # Unscaled and skipped in the kernel: no branch, so an overflowing call replays too.
    "adam fused": lambda params: torch.optim.Adam(params, lr=0.01, fused=True),
    "sgd fused": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True),
}


class _Loop:
    """A model, an optimizer, a scaler and the step that drives them, on a seed of its own."""

    def __init__(self, optimizer: str, unscale: bool, dropout: bool = False, init_scale: float = 2.0**8) -> None:
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(8, 16), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(0.25))
        self.model = nn.Sequential(*layers, nn.Linear(16, 1))
        self.opt = _OPTIMIZERS[optimizer](self.model.parameters())
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)
        self.unscale = unscale

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(self.model(x).float(), y)
        self.scaler.scale(loss).backward()
        if self.unscale:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss.detach()


def _same(a: Any, b: Any) -> bool:
    """Bitwise equal tensors (NaN where the other is NaN: an overflowed step's gradients), or equal values."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and bool(((a == b) | (a.isnan() & b.isnan())).all()))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _assert_same(eager: _Loop, copy: _Loop, where: str) -> None:
    for (name, p), (_, q) in zip(eager.model.named_parameters(), copy.model.named_parameters()):
        assert _same(p, q), f"{name} differs {where}"
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or _same(p.grad, q.grad)), \
            f"{name}.grad differs {where}"
    assert _same(eager.opt.state_dict(), copy.opt.state_dict()), f"optimizer state differs {where}"
    assert eager.scaler.get_scale() == copy.scaler.get_scale(), f"scale differs {where}"
    assert eager.scaler.state_dict() == copy.scaler.state_dict(), f"scaler state differs {where}"
    assert _same(eager.scaler._growth_tracker, copy.scaler._growth_tracker), f"growth tracker differs {where}"
    assert (dict(eager.scaler._per_optimizer_states) == dict(copy.scaler._per_optimizer_states) == {}
            and type(copy.scaler._per_optimizer_states) is type(eager.scaler._per_optimizer_states)), where


def _run(eager: _Loop, copy: _Loop, calls: int, overflowing: tuple[int, ...] = OVERFLOWING, **options: Any
         ) -> tuple[Any, list[str]]:
    """Run both loops ``calls`` times, comparing after each call; the traced step and graphprof's warnings."""
    traced = graphprof.trace(copy.step, profiling=True, **options)
    messages: list[str] = []
    for i in range(calls):
        x, y = _batch(i, overflowing)
        torch.manual_seed(100 + i)  # each side from the same generator state: dropout draws the same
        expected = eager.step(x, y)
        eager_rng = torch.get_rng_state()
        torch.manual_seed(100 + i)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        assert _same(expected, got), f"loss differs after call {i}"
        assert torch.equal(torch.get_rng_state(), eager_rng), f"generator differs after call {i}"
        _assert_same(eager, copy, f"after call {i}")
    return traced, messages


@pytest.mark.parametrize("unscale", [False, True], ids=["step", "unscale_ and clip"])
@pytest.mark.parametrize("optimizer", list(_OPTIMIZERS))
def test_a_scaled_step_replays_one_graph_and_an_overflow_runs_eagerly(optimizer: str, unscale: bool) -> None:
    eager, copy = _Loop(optimizer, unscale), _Loop(optimizer, unscale)
    traced, messages = _run(eager, copy, 9)
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    assert eager.scaler.get_scale() > 2.0**8  # it grew, after it backed off at the overflow
    assert traced.get_profile().graphs[0].nodes  # profiled, the eager call in between included
    rerun = 0 if "fused" in optimizer else len(OVERFLOWING)  # a fused kernel's overflowing call is replayed
    assert len(traced.get_profile().steps) == 9 - 2 - rerun  # eager, capture, then replays


def test_the_overflow_leaves_what_eager_leaves_with_dropout() -> None:
    """The replay that stops had drawn the dropout masks: the call's eager run draws them from the start."""
    eager, copy = _Loop("adam", unscale=True, dropout=True), _Loop("adam", unscale=True, dropout=True)
    traced, messages = _run(eager, copy, 7, overflowing=(3, 4))
    assert messages == [] and traced.capture_mode == "whole-step" and traced.captures == 1


@pytest.mark.parametrize("capture", ["auto", "fx"])
def test_an_overflow_in_the_capture_call_captures_on_the_next_call(capture: str) -> None:
    """The call that would capture skips its step: it runs eagerly, and the next call captures (with
    ``capture="fx"`` too: no error, since nothing falls back)."""
    eager, copy = _Loop("sgd momentum", unscale=False), _Loop("sgd momentum", unscale=False)
    traced, messages = _run(eager, copy, 7, overflowing=(1, 2, 5), capture=capture)
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def test_a_scaler_whose_every_call_overflows_stops_capturing_with_one_warning() -> None:
    """Each try runs the step up to the branch: one warning once ``CALL_ONLY_LIMIT`` tries in a row failed."""
    eager, copy = _Loop("sgd momentum", unscale=False), _Loop("sgd momentum", unscale=False)
    calls = CALL_ONLY_LIMIT + 3
    traced, messages = _run(eager, copy, calls, overflowing=tuple(range(1, calls)))
    assert len(messages) == 1 and "overflowed" in messages[0] and "segments" in messages[0], messages
    assert traced.capture_mode == "segments"


def test_settings_changed_between_calls_are_read_by_the_replay() -> None:
    eager, copy = _Loop("sgd momentum", unscale=False), _Loop("sgd momentum", unscale=False)
    traced = graphprof.trace(copy.step)
    for i in range(8):
        if i == 4:
            for loop in (eager, copy):
                loop.scaler.set_growth_factor(4.0)
                loop.scaler.set_growth_interval(1)
        x, y = _batch(i)
        assert _same(eager.step(x, y), traced(x, y)), f"loss differs after call {i}"
        assert eager.scaler.state_dict() == copy.scaler.state_dict(), f"scaler differs after call {i}"
    assert traced.capture_mode == "whole-step"


def test_an_unscale_outside_the_step_is_seen() -> None:
    """``unscale_`` called before the step has the step skip its own: not the captured path."""
    eager, copy = _Loop("sgd momentum", unscale=False), _Loop("sgd momentum", unscale=False)
    traced = graphprof.trace(copy.step)
    for i in range(6):
        x, y = _batch(i, ())
        if i == 4:
            for loop in (eager, copy):
                loop.opt.zero_grad()
                loop.scaler.scale(F.mse_loss(loop.model(x), y)).backward()
                loop.scaler.unscale_(loop.opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = _outcome(eager.step, x, y)
            got = _outcome(traced, x, y)
        assert _same(expected, got), f"outcome differs after call {i}"
        _assert_modules(eager, copy, f"after call {i}")


def _outcome(step: Callable[..., Any], *args: Any) -> Any:
    try:
        return step(*args)
    except RuntimeError as error:
        return str(error)


def _assert_modules(eager: _Loop, copy: _Loop, where: str) -> None:
    for p, q in zip(eager.model.parameters(), copy.model.parameters()):
        assert _same(p, q), f"parameters differ {where}"
    assert eager.scaler.state_dict() == copy.scaler.state_dict(), f"scaler differs {where}"


class _TwoOptimizers:
    """One scaler stepping two optimizers: the second's check comes after the first one's update."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.first = torch.optim.SGD(self.model[0].parameters(), lr=0.05, momentum=0.9)
        self.second = torch.optim.Adam(self.model[2].parameters(), lr=0.01)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.first.zero_grad()
        self.second.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.first)
        self.scaler.step(self.second)
        self.scaler.update()
        return loss.detach()


def _compare_loops(eager: Any, copy: Any, calls: int) -> tuple[Any, list[str]]:
    traced = graphprof.trace(copy.step)
    messages: list[str] = []
    for i in range(calls):
        x, y = _batch(i)
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        assert _same(expected, got), f"loss differs after call {i}"
        for p, q in zip(eager.model.parameters(), copy.model.parameters()):
            assert _same(p, q) and _same(p.grad, q.grad), f"parameters or gradients differ after call {i}"
        assert eager.scaler.state_dict() == copy.scaler.state_dict(), f"scaler differs after call {i}"
    return traced, messages


def test_a_check_after_an_update_is_refused() -> None:
    """The second optimizer's check follows the first one's update: a replay that stopped there could
    not give eager's outcome, so the step runs as segments, with one warning."""
    traced, messages = _compare_loops(_TwoOptimizers(), _TwoOptimizers(), 7)
    assert len(messages) == 1 and "overflowed gradients" in messages[0] and "segments" in messages[0], messages
    assert traced.capture_mode == "segments"


def test_a_refused_check_leaves_no_hook_of_graphprof_s_registered() -> None:
    """The refusal undoes the capture after its block has ended: the hook dicts it puts back must not
    register graphprof's capture hooks again (each such call left one more global forward pre-hook,
    and a user's ``torch.compile(model)`` then warned about global hooks on every call)."""
    hook_dicts = [getattr(nn.modules.module, name) for name in MODULE_GLOBAL_HOOK_DICTS]
    before = [dict(hooks) for hooks in hook_dicts]
    _compare_loops(_TwoOptimizers(), _TwoOptimizers(), 7)
    assert [dict(hooks) for hooks in hook_dicts] == before


class _Accumulating(_Loop):
    """Gradients zeroed in place at the step's end: the next call's backward and unscale write them."""

    def __init__(self) -> None:
        super().__init__("sgd momentum", unscale=False)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=False)
        return loss.detach()


def test_a_check_after_gradients_the_user_holds_were_written_is_refused() -> None:
    traced, messages = _compare_loops(_Accumulating(), _Accumulating(), 7)
    assert len(messages) == 1 and "written 2.bias.grad" in messages[0] and "segments" in messages[0], messages
    assert traced.capture_mode == "segments"


class _WithoutUpdate(_Loop):
    """``update()`` outside the step: the step leaves the scaler part way through an iteration."""

    def __init__(self) -> None:
        super().__init__("sgd momentum", unscale=False)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        return loss.detach()


def test_a_step_without_update_is_refused() -> None:
    eager, copy = _WithoutUpdate(), _WithoutUpdate()
    traced = graphprof.trace(copy.step)
    messages: list[str] = []
    for i in range(5):
        x, y = _batch(i)
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        eager.scaler.update()
        copy.scaler.update()
        assert _same(expected, got), f"loss differs after call {i}"
        _assert_modules(eager, copy, f"after call {i}")
    assert len(messages) == 1 and "without update()" in messages[0], messages
    assert traced.capture_mode == "segments"


class _Logging(_Loop):
    """Reads the scale before and after the update, and the growth tracker (``.item()`` of the scaler's own
    tensors): each replay reads this call's values."""

    def __init__(self) -> None:
        super().__init__("adam", unscale=True)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> Any:  # type: ignore[override]
        before = self.scaler.get_scale()
        loss = super().step(x, y)
        return loss, before, self.scaler.get_scale(), self.scaler._get_growth_tracker()


def test_the_scale_read_in_the_step_is_this_calls() -> None:
    eager, copy = _Logging(), _Logging()
    traced = graphprof.trace(copy.step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(9):
            x, y = _batch(i)
            assert _same(eager.step(x, y), traced(x, y)), f"loss or scale differs after call {i}"
            _assert_modules(eager, copy, f"after call {i}")
    assert not caught and traced.capture_mode == "whole-step" and traced.captures == 1


class _Counting(nn.Module):
    """A buffer written through views of it (an element, a reshaped view): each write is the buffer's."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.seen[0, 0] += 1
            self.seen.view(-1)[1:].add_(x.detach().float().abs().mean())
        return x


class _BatchNormLoop(_Loop):
    """BatchNorm writes its running statistics and ``num_batches_tracked`` in the forward, before the
    scaler's check: a replay puts them back when its gradients overflow."""

    def __init__(self, dims: int, momentum: float | None) -> None:
        super().__init__("adamw for-loop", unscale=True)
        torch.manual_seed(0)
        if dims == 1:
            body: list[nn.Module] = [nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=momentum)]
        else:
            body = [nn.Unflatten(1, (2, 2, 2)), nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4, momentum=momentum), nn.Flatten()]
        self.model = nn.Sequential(*body, _Counting(), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=0.01, foreach=False)


def _assert_buffers(eager: _Loop, copy: _Loop, where: str) -> None:
    for (name, b), (_, c) in zip(eager.model.named_buffers(), copy.model.named_buffers()):
        assert _same(b, c), f"{name} differs {where}"


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
@pytest.mark.parametrize("dims", [1, 2], ids=["BatchNorm1d", "BatchNorm2d"])
@pytest.mark.parametrize("infinite", ["target", "input"])
def test_a_step_that_writes_batchnorm_statistics_replays_and_an_overflow_puts_them_back(
        dims: int, momentum: float | None, infinite: str) -> None:
    """Overflowing calls in the middle, two of them in a row: each such replay wrote the running statistics,
    the count and the view-written buffer before its check, and the call's eager run starts from them as
    they were. An infinite target overflows the gradients with finite statistics (a statistic written twice
    would show); an infinite input makes the statistics themselves non-finite. With ``momentum=None`` the
    forward reads ``float(num_batches_tracked)``, which the graph reads too (capture/cumulative_averages.py):
    it replays the same way."""
    eager, copy = _BatchNormLoop(dims, momentum), _BatchNormLoop(dims, momentum)
    overflowing = (3, 5, 6) if infinite == "target" else (7, 8)
    traced = graphprof.trace(copy.step, profiling=True)
    messages: list[str] = []
    for i in range(10):
        x, y = _batch(i, () if infinite == "target" else overflowing)
        if infinite == "target" and i in overflowing:
            y = y.clone()
            y[0, 0] = float("inf")
        expected = eager.step(x, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = traced(x, y)
        messages += [str(w.message) for w in caught]
        assert _same(expected, got), f"loss differs after call {i}"
        _assert_same(eager, copy, f"after call {i}")
        _assert_buffers(eager, copy, f"after call {i}")
    assert messages == []
    assert traced.capture_mode == "whole-step" and traced.captures == 1
    assert len(traced.get_profile().steps) == 10 - 2 - len(overflowing)  # eager, capture, reruns: not recorded
    assert int(copy.model.get_submodule(str(1 if dims == 1 else 2)).num_batches_tracked) == 10


class _ClampingParameters(_Loop):
    """Clamps a parameter in place in the forward, before the scaler's check: not a buffer to put back."""

    def __init__(self) -> None:
        super().__init__("sgd momentum", unscale=False)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.model[0].weight.clamp_(-0.5, 0.5)
        return super().step(x, y)


def test_a_check_after_a_parameter_was_written_is_refused() -> None:
    traced, messages = _compare_loops(_ClampingParameters(), _ClampingParameters(), 7)
    assert len(messages) == 1, messages
    assert "comes after the step has written 0.weight (clamp_" in messages[0] and "segments" in messages[0]
    assert traced.capture_mode == "segments"


class _AveragedCounts(_Loop):
    """``_Counting``'s buffer, written in the forward before the scaler's check, then given new data after
    the update (``seen.data = ...``): its storage is another after every replay, so a copy of the one the
    capture call left cannot put it back."""

    def __init__(self) -> None:
        super().__init__("sgd momentum", unscale=False)
        self.model = nn.Sequential(nn.Linear(8, 16), _Counting(), nn.ReLU(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = super().step(x, y)
        with torch.no_grad():
            seen = self.model[1].seen
            seen.data = seen.data * 0.5
        return loss


def test_a_check_after_a_buffer_given_new_data_was_written_is_refused() -> None:
    eager, copy = _AveragedCounts(), _AveragedCounts()
    traced, messages = _compare_loops(eager, copy, 7)
    _assert_buffers(eager, copy, "after the last call")
    assert len(messages) == 1, messages
    assert "comes after the step has written 1.seen" in messages[0] and "segments" in messages[0]
    assert traced.capture_mode == "segments"
