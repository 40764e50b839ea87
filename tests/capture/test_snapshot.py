"""A failed capture leaves no trace: state the step wrote is restored, BatchNorm statistics included.

``aten.native_batch_norm``'s schema does not mark ``running_mean`` and
``running_var`` as written, yet in training mode it updates them in place; a
capture that fails after the forward pass must put them back, or
``capture="auto"``'s fallback applies the update a second time.

The capture call's own writes to a tensor of one element, which it undoes
and runs again where make_fx ran them twice, must not draw from the
generator again when the op is random (the tests at the end).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphprof
from graphprof.capture.errors import CaptureError
from graphprof.capture.snapshot import WriteLog


def _bn_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2),
                          nn.BatchNorm1d(2))
    model(torch.randn(2, 3, 6, 6))  # materialise the lazy layer
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model: nn.Module, opt: torch.optim.Optimizer, log: list[str]):
    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        log.append(f"{loss.item():.6f}")  # formatting a host read: whole-step capture fails here, after every write
        return loss
    return step


def _inputs(i: int) -> torch.Tensor:
    return torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(i))


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        out[f"grad{i}"] = None if p.grad is None else p.grad.clone()
        for key, value in opt.state.get(p, {}).items():
            out[f"opt{i}.{key}"] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{k} differs"
        else:
            assert a[k] == b[k], f"{k} differs"


def test_failed_fx_capture_restores_batchnorm_running_stats() -> None:
    model, opt = _bn_model()
    fn = graphprof.trace(_step(model, opt, []), capture="fx")
    fn(_inputs(0))  # eager warm-up call
    before = _state(model, opt)
    with pytest.raises(CaptureError):
        fn(_inputs(1))
    _assert_bitwise_equal(before, _state(model, opt))


def test_auto_fallback_updates_batchnorm_stats_exactly_once() -> None:
    eager_model, eager_opt = _bn_model()
    traced_model, traced_opt = _bn_model()
    eager_log: list[str] = []
    traced_log: list[str] = []
    eager = _step(eager_model, eager_opt, eager_log)
    traced = graphprof.trace(_step(traced_model, traced_opt, traced_log), capture="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one fallback warning
        for i in range(5):
            eager(_inputs(i))
            traced(_inputs(i))
            _assert_bitwise_equal(_state(eager_model, eager_opt), _state(traced_model, traced_opt))
    assert eager_log == traced_log
    assert int(traced_model[1].num_batches_tracked) == 1 + 5  # the call that built the lazy layer, then 5 steps


def test_write_log_copies_what_a_schema_does_not_declare() -> None:
    """The undo log knows every op whose schema under-declares its writes, by argument name."""
    mean, var = torch.zeros(3), torch.ones(3)
    log = WriteLog()
    x = torch.randn(4, 3)
    op = torch.ops.aten.native_batch_norm.default
    log.before_write(op, (x, None, None, mean, var, True, 0.1, 1e-5), {}, lambda t: True)
    op(x, None, None, mean, var, True, 0.1, 1e-5)
    assert not torch.equal(mean, torch.zeros(3))
    log.restore()
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))
    evaluation = WriteLog()  # in eval mode nothing is written, so nothing is copied
    evaluation.before_write(op, (x, None, None, mean, var, False, 0.1, 1e-5), {}, lambda t: True)
    assert not evaluation._tensors


def test_every_undeclared_write_of_common_training_ops_is_listed() -> None:
    """Norms, RNNs, attention, dropout, embeddings and optimizers: each write a schema hides is known."""
    from benchmarks.undeclared_writes import scan
    from graphprof.capture.snapshot import UNDECLARED_WRITES

    found, runs = scan()
    assert runs > 10 and "aten::native_batch_norm" in found
    for op, arguments in found.items():
        assert arguments <= set(UNDECLARED_WRITES.get(op, ((), None))[0]), (op, arguments)


_ALIAS_WRITES = {
    # An EMA written through ``.data`` (older code), a detached alias, a slice view, an item of ``.data``.
    ".data": lambda ema, src: ema.weight.data.mul_(0.5).add_(src.weight.data, alpha=0.5),
    "detach()": lambda ema, src: ema.weight.detach().mul_(0.5).add_(src.weight.detach(), alpha=0.5),
    "a slice view": lambda ema, src: ema.weight[:, :2].add_(1.0),
    "an item of .data": lambda ema, src: ema.bias.data.__setitem__(0, ema.bias.data[0] + 1.0),
}


@pytest.mark.parametrize("kind", list(_ALIAS_WRITES))
def test_a_write_through_an_alias_is_undone_when_the_capture_is_refused(kind: str) -> None:
    """The write happened on a tensor made during the step that shares a parameter's storage; a capture
    refused later in the call left it done, and the segments did it again (the EMA moved twice)."""
    def make() -> tuple:
        torch.manual_seed(0)
        model, ema = nn.Linear(3, 1), nn.Linear(3, 1).requires_grad_(False)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(x).sum()
            loss.backward()
            _ALIAS_WRITES[kind](ema, model)
            if loss.item() > 1e9:  # refuses the capture, after the write
                print("diverged")
            return loss.detach()
        return step, ema

    eager, eager_ema = make()
    step, ema = make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(4):
            x = torch.full((2, 3), float(i + 1))
            eager(x)
            traced(x)
            assert torch.equal(eager_ema.weight, ema.weight) and torch.equal(eager_ema.bias, ema.bias), f"call {i}"
    assert traced.capture_mode == "segments"


def test_a_generator_the_step_draws_from_is_put_back_when_the_capture_is_refused() -> None:
    """``torch.randn(..., generator=g)`` before a refusal: the CPU generator was put back, ``g`` was not,
    and the segments drew the next numbers from it (other noise, another loss, from the first call on)."""
    def make() -> tuple:
        torch.manual_seed(0)
        model, gen = nn.Linear(3, 1), torch.Generator().manual_seed(123)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = model(x + torch.randn(x.shape, generator=gen)).sum()
            loss.backward()
            if loss.item() > 1e9:
                print("diverged")
            return loss.detach()
        return step, gen

    (eager, eager_gen), (step, gen) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            assert torch.equal(eager(torch.ones(2, 3)), traced(torch.ones(2, 3))), f"call {i}"
            assert torch.equal(eager_gen.get_state(), gen.get_state()), f"call {i}"


def test_an_argument_written_in_place_is_put_back_when_the_capture_fails() -> None:
    """``x.mul_(0.5)`` on the caller's tensor, then a bad batch on the call that captures: the capture
    stops and the step runs eagerly from the state it put back, so ``x`` is halved once, as in eager."""
    def make() -> Any:
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3)

        def step(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            x.mul_(0.5)
            return (emb(idx) * x.sum()).sum().detach()
        return step

    eager, traced = make(), graphprof.trace(make(), profiling=False)
    for i, bad in enumerate([False, True, False]):
        xs = [torch.ones(2), torch.ones(2)]
        idx = torch.tensor([12 if bad else 1])
        outcomes = []
        for fn, x in zip((eager, traced), xs):
            try:
                outcomes.append(fn(x, idx))
            except IndexError as exc:
                outcomes.append(type(exc))
        assert torch.equal(xs[0], xs[1]), f"call {i}"
        assert outcomes[0] is IndexError if bad else torch.equal(outcomes[0], outcomes[1])


def _reinitializing_step(every: int) -> tuple[Any, nn.Module]:
    """``model[2].reset_parameters()`` every ``every`` calls: a ``Linear(8, 1)``, whose bias has one element."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {"n": 0}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] % every == 0:
            model[2].reset_parameters()  # "reset dead units", a head re-initialized in continual learning
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, model


def _drawing_step(draw: str, shape: tuple[int, ...]) -> tuple[Any, nn.Module]:
    """A random op in place on a parameter of one element (``bias.uniform_(...)`` under no_grad)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    extra = nn.Parameter(torch.zeros(shape))
    model.register_parameter("extra", extra)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            getattr(extra, draw)(*{"uniform_": (-0.3, 0.3), "normal_": (), "bernoulli_": (0.5,)}[draw])
        loss = torch.nn.functional.mse_loss(model(x) + extra.sum(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, model


def _compare_draws(eager: Any, eager_model: nn.Module, step: Any, model: nn.Module, calls: int) -> Any:
    """Each call from the same global seed: loss, parameters and the global generator's state as eager's."""
    traced = graphprof.trace(step, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here is refused: it replays whole-step
        for i in range(calls):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
            torch.manual_seed(100 + i)
            expected, expected_rng = eager(x, y), torch.get_rng_state()
            torch.manual_seed(100 + i)
            got, got_rng = traced(x, y), torch.get_rng_state()
            assert torch.equal(expected, got), f"call {i}"
            assert torch.equal(expected_rng, got_rng), f"call {i}: the global generator's state"
            for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
                assert torch.equal(p, q), f"call {i}: {name}"
    return traced


@pytest.mark.parametrize("every", [1, 3])
def test_a_layer_of_one_output_reinitialized_in_the_step_draws_as_eager(every: int) -> None:
    """The capture ran ``uniform_`` on the one-element bias again, to undo a constant propagation make_fx
    does not do for random ops: a second draw, another bias and a shifted generator from then on."""
    traced = _compare_draws(*_reinitializing_step(every), *_reinitializing_step(every), calls=7)
    assert traced.capture_mode == "whole-step"


@pytest.mark.parametrize("draw", ["uniform_", "normal_", "bernoulli_"])
@pytest.mark.parametrize("shape", [(1,), ()])
def test_a_random_op_in_place_on_a_one_element_parameter_draws_once(draw: str, shape: tuple[int, ...]) -> None:
    traced = _compare_draws(*_drawing_step(draw, shape), *_drawing_step(draw, shape), calls=4)
    assert traced.capture_mode == "whole-step"
