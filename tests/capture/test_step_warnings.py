"""Warnings the step issues are issued by every replay, blamed where eager blames them
(capture/step_warnings.py).

Before, a replay issued none: a warning on every eager call came once. The
capture call's warning from torch's Python (``F.mse_loss`` of a target of
another shape) was blamed on a line of torch's tracer, a location the
default filter showed once more.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof


def _warn_twice_up() -> None:
    warnings.warn("from a helper, blamed on its caller", RuntimeWarning, stacklevel=2)


def _make() -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: dict[str, Any] = {"calls": 0}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)  # y is (n, 1): torch's Python warns of the broadcast
        warnings.warn("a warning of the step's own", stacklevel=1)
        _warn_twice_up()
        loss.backward()
        opt.step()
        kept["calls"] += 1
        return loss

    return step, model, kept


def _issued(traced: bool, setup: Callable[[], None], calls: int = 4) -> tuple[list[tuple], list[Any], nn.Module]:
    step, model, kept = _make()
    fn = graphprof.trace(profiling=False)(step) if traced else step
    results: list[Any] = []
    with warnings.catch_warnings(record=True) as issued:
        setup()
        for i in range(calls):
            torch.manual_seed(i)
            x, y = torch.randn(3, 4), torch.randn(3, 1)
            try:
                results.append(fn(x, y))
            except Warning as exc:  # the filters made an error of it
                results.append(repr(exc))
    seen = [(w.category, str(w.message), w.filename, w.lineno) for w in issued
            if not str(w.message).startswith("graphprof")]
    return seen, results + [kept["calls"]], model


@pytest.mark.parametrize("action", ["always", "default", "once", "module", "ignore"])
def test_replays_issue_the_warnings_eager_issues(action: str) -> None:
    eager, eager_results, eager_model = _issued(False, lambda: warnings.simplefilter(action))
    traced, traced_results, traced_model = _issued(True, lambda: warnings.simplefilter(action))
    assert traced == eager
    if action == "always":
        assert len(eager) == 12  # three warnings on each of four calls
    assert [r.tolist() if isinstance(r, torch.Tensor) else r for r in traced_results] == \
        [r.tolist() if isinstance(r, torch.Tensor) else r for r in eager_results]
    for a, b in zip(eager_model.parameters(), traced_model.parameters()):
        assert torch.equal(a, b)


def test_a_warning_the_filters_make_an_error_is_raised_where_eager_raises_it() -> None:
    def setup() -> None:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", message="a warning of the step's own")

    eager, eager_results, eager_model = _issued(False, setup)
    traced, traced_results, traced_model = _issued(True, setup)
    assert traced == eager
    assert traced_results == eager_results  # every call raised before its backward: nothing counted
    assert traced_results[-1] == 0
    for a, b in zip(eager_model.parameters(), traced_model.parameters()):
        assert torch.equal(a, b)


def test_an_error_filter_added_after_the_capture_stops_the_replay_where_eager_stops() -> None:
    step, model, kept = _make()
    fn = graphprof.trace(profiling=False)(step)
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):  # eager, capture, replay
            fn(x, y)
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", message="a warning of the step's own")
        with pytest.raises(UserWarning, match="of the step's own"):
            fn(x, y)
    assert kept["calls"] == 3
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)  # stopped before the optimizer's update, as eager stops


class _CallerBlamed(torch.optim.lr_scheduler.StepLR):
    """A user's scheduler warning from its own ``step``: once on its own line, once on the line that
    called the traced step (past the step's frames: the callers of graphprof, live on every replay)."""

    def step(self, epoch: Any = None) -> None:
        warnings.warn("a scheduler's own warning", RuntimeWarning, stacklevel=1)
        warnings.warn("blamed on the step's caller", RuntimeWarning, stacklevel=3)
        super().step()


def _by_epoch(opt: torch.optim.Optimizer) -> Callable[[int], None]:
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    return lambda i: sched.step(i)  # an epoch argument: torch's deprecation warning, blamed on this line


def _through_a_helper(opt: torch.optim.Optimizer) -> Callable[[int], None]:
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)

    def advance(i: int) -> None:
        sched.step(i)  # blamed on this line

    return advance


def _users_scheduler(opt: torch.optim.Optimizer) -> Callable[[int], None]:
    sched = _CallerBlamed(opt, 2)
    return lambda i: sched.step()


def _in_sequential(opt: torch.optim.Optimizer) -> Callable[[int], None]:
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.ConstantLR(opt),
                                                        _CallerBlamed(opt, 2)], milestones=[2])
    return lambda i: sched.step()


_SCHEDULER_STEPS: dict[str, Callable[[torch.optim.Optimizer], Callable[[int], None]]] = {
    "StepLR.step(epoch)": _by_epoch, "through a helper": _through_a_helper,
    "a user's scheduler": _users_scheduler, "in SequentialLR": _in_sequential,
}


@pytest.mark.parametrize("action", ["always", "default", "module"])
@pytest.mark.parametrize("kind", list(_SCHEDULER_STEPS))
def test_a_schedulers_warning_is_issued_by_its_own_replayed_step_where_eager_blames_it(kind: str,
                                                                                      action: str) -> None:
    """Its replay called it from host_calls.py: the warning was blamed there (capture and replays), which
    filters by module or line and the default filter's once-per-line see differently."""
    def run(traced: bool) -> list[tuple]:
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter(action)
            torch.manual_seed(0)
            model = nn.Linear(4, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            advance = _SCHEDULER_STEPS[kind](opt)  # (its first step, made here, warns too)

            def step(x: torch.Tensor, i: int) -> torch.Tensor:
                opt.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                advance(i)
                return loss

            fn = graphprof.trace(profiling=False)(step) if traced else step
            for i in range(4):
                fn(torch.full((2, 4), float(i)), i)
        seen = [(w.category, str(w.message), w.filename, w.lineno) for w in issued
                if not str(w.message).startswith("graphprof")]
        return seen + [(opt.param_groups[0]["lr"], [p.tolist() for p in model.parameters()])]

    eager = run(False)
    assert len(eager) > 1
    assert run(True) == eager


def test_a_capture_that_probes_a_fused_path_leaves_the_registries_as_they_were() -> None:
    """The probe of an eval TransformerEncoderLayer's fused path silenced its warnings by changing the
    filters, which makes every registry forget: the replay then showed a warning eager had shown."""
    def run(traced: bool) -> list[tuple]:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()

        def step(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                out = layer(x)
            warnings.warn("once per line under the default filter", stacklevel=1)
            return out

        fn = graphprof.trace(profiling=False)(step) if traced else step
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter("default")
            for _ in range(4):
                fn(torch.randn(2, 3, 8))
        return [(str(w.message), w.lineno) for w in issued if not str(w.message).startswith("graphprof")]

    eager = run(False)
    assert len(eager) == 1
    assert run(True) == eager


@pytest.mark.parametrize("action", ["default", "always"])
def test_a_bad_batch_after_a_warning_runs_eagerly_when_eager_would_not_show_it_again(action: str) -> None:
    """A replay that raised after issuing a warning ran Python eager would run again: the step can run
    eagerly only when eager's warning would show nothing (shown already, once per line); under
    ``"always"`` it would show twice, so the call raises with one warning and later calls run as
    segments. Either way the caller gets eager's error, state and warnings."""
    def run(traced: bool) -> tuple[list[Any], list[tuple], nn.Module, int]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        table = torch.arange(3.0)
        kept = {"calls": 0}

        def step(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            warnings.warn("once per line under the default filter", stacklevel=1)
            loss = (model(x).sum() * table[i]).sum()  # a bad index raises here
            loss.backward()
            opt.step()
            kept["calls"] += 1
            return loss

        fn = graphprof.trace(profiling=False)(step) if traced else step
        results: list[Any] = []
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter(action)
            for i in [0, 1, 2, 7, 1]:
                try:
                    results.append(fn(torch.full((3, 4), float(i)), torch.tensor([i])).item())
                except IndexError as exc:
                    results.append(type(exc).__name__)
        seen = [(str(w.message), w.lineno) for w in issued]
        return results, seen, model, kept["calls"]

    eager, eager_seen, eager_model, eager_calls = run(False)
    traced, traced_seen, model, calls = run(True)
    assert traced == eager and calls == eager_calls
    fallbacks = [text for text, _ in traced_seen if text.startswith("graphprof")]
    assert [s for s in traced_seen if not s[0].startswith("graphprof")] == eager_seen
    assert len(fallbacks) == (0 if action == "default" else 1), fallbacks
    for a, b in zip(eager_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def _filters_step(body: Callable[[], Any]) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        body()
        loss.backward()
        opt.step()
        return loss.detach()

    return step, model


def _ignored_inside() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.warn("ignored inside the step", stacklevel=1)


def _recorded_inside() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("recorded inside the step", stacklevel=1)
    RECORDED.append(len(seen))


def _filter_added() -> None:
    warnings.filterwarnings("ignore", message="never issued")
    warnings.warn("after a filter the step adds", stacklevel=1)


RECORDED: list[int] = []


@pytest.mark.parametrize("body", [_ignored_inside, _recorded_inside, _filter_added],
                         ids=["catch_warnings ignore", "catch_warnings record", "filterwarnings"])
def test_a_step_that_changes_the_warning_filters_issues_what_eager_issues(body: Callable[[], Any]) -> None:
    """Its own filters decide inside it, and eager's change makes every registry forget (entering
    ``catch_warnings`` too): a replay would issue under the caller's filters. The capture refuses."""
    def run(traced: bool) -> tuple[list[tuple], list[torch.Tensor], list[int], list[str]]:
        RECORDED.clear()
        step, model = _filters_step(body)
        fn = graphprof.trace(profiling=False)(step) if traced else step
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter("default")
            for i in range(4):
                fn(torch.full((3, 4), float(i)))
        seen = [(str(w.message), w.lineno) for w in issued if not str(w.message).startswith("graphprof")]
        ours = [str(w.message) for w in issued if str(w.message).startswith("graphprof")]
        return seen, [p.detach().clone() for p in model.parameters()], list(RECORDED), ours

    eager, eager_weights, eager_recorded, _ = run(False)
    traced, weights, recorded, ours = run(True)
    assert traced == eager and recorded == eager_recorded
    assert all(torch.equal(a, b) for a, b in zip(eager_weights, weights))
    assert len(ours) == 1 and "warning filters" in ours[0], ours


def test_a_filter_whose_module_is_a_plain_string_is_matched_as_warnings_matches_it() -> None:
    """Python's own startup filters hold ``'__main__'`` as a string, not a regex: taken for one, the
    capture failed on any warning the step issued under them."""
    step, model = _filters_step(lambda: warnings.warn("deprecated here", DeprecationWarning, stacklevel=1))
    traced = graphprof.trace(profiling=False)(step)
    with warnings.catch_warnings(record=True) as issued:
        warnings.resetwarnings()
        warnings.filters.insert(0, ("always", None, DeprecationWarning, __name__, 0))
        for i in range(4):
            traced(torch.full((3, 4), float(i)))
    assert [str(w.message) for w in issued] == ["deprecated here"] * 4
    assert traced.capture_mode == "whole-step"


def test_an_error_filter_for_a_warning_after_the_update_runs_the_call_eagerly() -> None:
    """The replay would stop at the warning after the optimizer's update, where it cannot leave what
    eager leaves (the gradients kept); the call runs eagerly instead and raises eager's error."""
    def run(traced: bool) -> list[Any]:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            warnings.warn("after the update", stacklevel=1)
            return loss.detach()

        fn = graphprof.trace(profiling=False)(step) if traced else step
        seen: list[Any] = []
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for i in range(5):
                if i == 3:
                    warnings.simplefilter("error", UserWarning)
                try:
                    seen.append(fn(torch.full((3, 4), float(i))).tolist())
                except UserWarning as exc:
                    seen.append(str(exc))
                seen.append([(p.tolist(), None if p.grad is None else p.grad.tolist()) for p in model.parameters()])
        return seen

    eager = run(False)
    assert "after the update" in eager
    assert run(True) == eager


class _Clamped(torch.autograd.Function):
    """A custom Function whose forward warns, as torch's reentrant checkpoint does of its inputs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("clamping in a custom Function's forward", stacklevel=2)
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _function_warnings(traced: bool, action: str) -> list[tuple]:
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        # reentrant checkpointing warns "None of the inputs have requires_grad=True" from its Function
        out = torch.utils.checkpoint.checkpoint_sequential(seq, 2, x, use_reentrant=True)
        loss = F.mse_loss(_Clamped.apply(out), y)
        loss.backward()
        opt.step()
        return loss.detach()

    fn = graphprof.trace(step) if traced else step
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter(action)
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            fn(torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g))
    return [(w.category, str(w.message), w.filename, w.lineno) for w in issued
            if not str(w.message).startswith("graphprof")]


@pytest.mark.parametrize("action", ["always", "default"])
def test_a_warning_in_a_custom_functions_forward_is_replayed_where_eager_issues_it(action: str) -> None:
    """graphprof's stand-in for ``Function.apply`` stood between the forward and the step, so the
    warning was taken for graphprof's own: issued by the capture call only, never by a replay."""
    eager = _function_warnings(False, action)
    assert len(eager) == (8 if action == "always" else 2)
    assert _function_warnings(True, action) == eager


def test_a_compiled_module_in_the_step_gives_no_warning_of_the_captures_global_hooks() -> None:
    """``torch.compile(model)`` called in the step warns when global module hooks are registered. The
    capture's own hooks made it warn where eager did not, besides graphprof's one fallback warning."""
    def make() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        return model, step

    runs = []
    for traced in (False, True):
        model, step = make()
        call = graphprof.trace(step) if traced else step
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = [call(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(3)]
        runs.append((model, losses, [str(w.message) for w in caught]))
    (eager_model, eager_losses, eager_warnings), (traced_model, traced_losses, traced_warnings) = runs
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, traced_losses, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(eager_model.parameters(), traced_model.parameters(), strict=True))
    assert eager_warnings == []
    assert len(traced_warnings) == 1 and "compiled with torch.compile" in traced_warnings[0], traced_warnings
