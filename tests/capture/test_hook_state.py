"""What a hook on the step's modules keeps: activations it logs, statistics it counts.

A forward hook is user code that runs inside the step, but its closure was
not the step's to watch: ``register_forward_hook(lambda m, i, o:
acts.append(o.mean().item()))`` appended once, in the capture call, and a
replay never again; worse, the value it appended was graphprof's traced
number, which raised when the user compared it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import graphprof

CALLS = 5


class _Stats:
    """A monitor object whose bound method is the hook."""

    def __init__(self) -> None:
        self.calls = 0
        self.means: list[float] = []

    def record(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self.calls += 1
        self.means.append(output.mean().item())


def _log_into(kept: dict[str, Any], name: str, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
    kept["acts"].append(output.detach().sum(0))
    kept["items"].append(output.mean().item())


def _make(hook: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: Any
    if hook == "a closure":
        kept = {"acts": [], "items": []}

        def log(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            kept["acts"].append(output.detach().sum(0))
            kept["items"].append(output.mean().item())
        model[1].register_forward_hook(log)
    elif hook == "a partial":  # timm's and torchvision's feature extractors: ``partial(hook, name)``
        kept = {"acts": [], "items": []}
        model[1].register_forward_hook(functools.partial(_log_into, kept, "relu"))
    else:
        kept = _Stats()
        model[1].register_forward_hook(kept.record)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, kept


def _state(kept: Any) -> Any:
    if isinstance(kept, dict):
        return [a.tolist() for a in kept["acts"]], list(kept["items"])
    return kept.calls, list(kept.means)


def test_what_a_forward_hook_keeps_is_kept_on_every_call() -> None:
    for hook in ("a closure", "a bound method", "a partial"):
        (eager, eager_kept), (step, kept) = _make(hook), _make(hook)
        traced = graphprof.trace(step)
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(CALLS):
                x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
                assert torch.equal(eager(x, y), traced(x, y))
                assert _state(eager_kept) == _state(kept), f"{hook}: what the hook keeps differs after call {i}"
        assert traced.capture_mode == "whole-step" and traced.captures == 1, hook
        values = kept["items"] if isinstance(kept, dict) else kept.means
        assert len(values) == CALLS and all(type(v) is float for v in values), hook


def test_what_an_optimizer_step_hook_keeps_is_kept_on_every_call() -> None:
    """``opt.register_step_post_hook(lambda o, a, k: log.append(...))`` runs inside the step: a replay
    did not run it, and the list stopped growing after the capture, with no warning."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], list[Any]]:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log: list[Any] = []
        opt.register_step_post_hook(lambda o, a, k: log.append(o.param_groups[0]["lr"]))

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, log

    (eager, expected), (step, got) = make(), make()
    traced = graphprof.trace(step, profiling=False)
    for i in range(5):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
        assert torch.equal(eager(x), traced(x))
        assert got == expected, f"call {i}"
    assert traced.capture_mode == "whole-step"


def _logged_alike(make: Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], Any]],
                  logs: Callable[[Any], dict[str, list[torch.Tensor]]],
                  between: Callable[[Any], None] = lambda kept: None) -> None:
    """Run an eager and a traced copy of ``make()``'s step (no warning allowed: whole-step) and compare,
    after every call, the loss and each list of tensors ``logs`` finds in what the copy keeps, one item
    more per call; ``between`` changes what each copy keeps after every call."""
    (eager, eager_kept), (step, kept) = make(), make()
    traced = graphprof.trace(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(CALLS):
            x = torch.randn(6, 4, generator=torch.Generator().manual_seed(i))
            assert torch.equal(eager(x), traced(x)), f"loss of call {i}"
            for name, expected in logs(eager_kept).items():
                got = logs(kept)[name]
                assert len(got) == len(expected) == i + 1, f"{name} after call {i}"
                assert all(map(torch.equal, expected, got)), f"{name} after call {i}"
            between(eager_kept)
            between(kept)
    assert traced.capture_mode == "whole-step"


class _Annealed:
    """A scale a pre-hook multiplies the input by, annealed by the loop between calls, and what the
    other hooks log."""

    def __init__(self) -> None:
        self.scale = 1.0
        self.logged: dict[str, list[torch.Tensor]] = {"grad": [], "grad_output": [], "step": [], "accumulated": []}


def _scaled(state: _Annealed, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return (inputs[0] * state.scale,)


def _log_grad(state: _Annealed, grad: torch.Tensor) -> None:
    state.logged["grad"].append(grad.norm())


def _log_grad_output(state: _Annealed, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
    state.logged["grad_output"].append(grad_output[0].sum())


def _log_step(state: _Annealed, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    state.logged["step"].append(opt.param_groups[0]["params"][0].detach().sum())


def _log_accumulated(state: _Annealed, param: torch.Tensor) -> None:
    state.logged["accumulated"].append(param.grad.sum())


def test_hooks_given_as_partials_read_and_keep_their_state_on_every_call() -> None:
    """A hook given as a ``functools.partial`` bound its state out of the walk's sight (the step's code
    never names it): a pre-hook's annealed scale was the capture call's in every replay (other weights,
    silently), and the lists the other hooks keep stopped growing."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], _Annealed]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = _Annealed()
        model[2].register_forward_pre_hook(functools.partial(_scaled, state))
        model[2].register_full_backward_hook(functools.partial(_log_grad_output, state))
        opt.register_step_post_hook(functools.partial(_log_step, state))
        model[0].bias.register_post_accumulate_grad_hook(functools.partial(_log_accumulated, state))
        model.grad_hook = functools.partial(_log_grad, state)  # kept by the model, registered by the step

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            hidden = model[1](model[0](x))
            hidden.register_hook(model.grad_hook)
            loss = model[2](hidden).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, state

    def anneal(state: _Annealed) -> None:
        state.scale *= 0.5

    _logged_alike(make, lambda state: state.logged, anneal)


def test_a_multi_grad_hook_runs_in_every_replay() -> None:
    """``register_multi_grad_hook(params, fn)`` puts a hook of torch's on each tensor, which calls ``fn``
    once all their gradients are ready: ``fn`` ran in the capture call and never in a replay."""
    def make() -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log: list[torch.Tensor] = []
        torch.autograd.graph.register_multi_grad_hook(
            list(model[0].parameters()), lambda grads: log.append(sum(g.sum() for g in grads if g is not None)))

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, log

    _logged_alike(make, lambda log: {"log": log})
