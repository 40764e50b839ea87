"""Shared helpers: run a demo step eagerly and traced, compare everything."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.demo.steps import DemoStep


def run_eager(demo: DemoStep, steps: int, seed: int = 1234) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [demo.step_fn(*demo.make_inputs(i)).detach().clone() for i in range(steps)]


def run_traced(demo: DemoStep, steps: int, seed: int = 1234, **options: Any) -> tuple[list[torch.Tensor], Any]:
    torch.manual_seed(seed)
    fn = graphprof.trace(demo.step_fn, **options)
    return [fn(*demo.make_inputs(i)).detach().clone() for i in range(steps)], fn


def assert_same_state(a: DemoStep, b: DemoStep) -> None:
    """Parameters, buffers, gradients and optimizer state are bitwise equal."""
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), f"state {name} differs"
    for (name, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert (p.grad is None) == (q.grad is None), f"grad of {name}: one is None"
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"grad of {name} differs"
    if a.optimizer is not None:
        sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for k in sa:
            for key, value in sa[k].items():
                other = sb[k][key]
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, other), f"optimizer state {k}.{key} differs"
                else:
                    assert value == other


def assert_modules_equal(a: torch.nn.Module, b: torch.nn.Module, where: str = "") -> None:
    """Parameters, buffers and gradients of two copies of a model are bitwise equal."""
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), f"state {name} differs {where}"
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert (p.grad is None) == (q.grad is None), f"grad of {name}: one is None {where}"
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"grad of {name} differs {where}"


def assert_bitwise_against_eager(make: Any, inputs: Any, calls: int, device: torch.device | None = None,
                                 **options: Any) -> Any:
    """Build two copies with ``make()`` -> (model, step), run one eagerly and one traced.

    ``inputs(i)`` gives call i's arguments. After every call the results,
    the models (parameters, buffers, gradients), the gradients of the
    arguments that require grad and the global RNG state are bitwise equal.
    Each side gets its own copy of such an argument: a backward gives it a
    ``.grad``, which the other side's call would otherwise accumulate into.
    With ``device``, both models and every call's tensors are moved there
    (the models before any step, so an optimizer keeps its parameters) and
    the device's generator is compared too. Returns the traced function.
    """
    torch.manual_seed(0)
    model_a, step_a = make()
    torch.manual_seed(0)
    model_b, step_b = make()
    if device is not None:
        model_a.to(device)
        model_b.to(device)
    traced = graphprof.trace(step_b, **options)
    for i in range(calls):
        args = inputs(i)
        if device is not None:
            args = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), args)
        args_b = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.detach().clone().requires_grad_() if t.requires_grad else t, args)
        torch.manual_seed(1000 + i)
        out_a = step_a(*args)
        rng_a, device_rng_a = torch.get_rng_state(), _device_rng(device)
        torch.manual_seed(1000 + i)
        out_b = traced(*args_b)
        where = f"after call {i}"
        assert torch.equal(_device_rng(device), device_rng_a), f"device RNG state differs {where}"
        for x, y in zip(torch.utils._pytree.tree_leaves(args), torch.utils._pytree.tree_leaves(args_b)):
            if isinstance(x, torch.Tensor) and x.requires_grad:
                assert (x.grad is None) == (y.grad is None), f"an argument's .grad: one is None {where}"
                assert x.grad is None or torch.equal(x.grad, y.grad), f"an argument's .grad differs {where}"
        assert torch.equal(torch.get_rng_state(), rng_a), f"RNG state differs {where}"
        for x, y in zip(torch.utils._pytree.tree_leaves(out_a), torch.utils._pytree.tree_leaves(out_b)):
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y)), f"result differs {where}"
        assert_modules_equal(model_a, model_b, where)
    return traced


def _device_rng(device: torch.device | None) -> torch.Tensor:
    """The generator state of ``device`` (an empty tensor without one)."""
    if device is None or device.type == "cpu":
        return torch.empty(0)
    return torch.get_device_module(device.type).get_rng_state()


def optimizer_loop(make_optimizer: Callable[[Any], torch.optim.Optimizer], traced: bool, calls: int = 7,
                   between: Callable[[int, torch.optim.Optimizer], None] = lambda i, opt: None,
                   device: torch.device | None = None, **options: Any) -> tuple[Any, Any]:
    """A small model trained by ``make_optimizer(params)`` for ``calls`` calls, eagerly or traced with
    ``options`` (``between(i, opt)`` runs before call i), on ``device`` if given: ((losses,
    parameters, the optimizer's ``state_dict``, its ``t`` if it keeps one), the function called)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device or "cpu")
    opt = make_optimizer(model.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = graphprof.trace(step, **options) if traced else step
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(calls):
        between(i, opt)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        losses.append(run(x.to(device or "cpu"), y.to(device or "cpu")))
    return (losses, [p.detach().clone() for p in model.parameters()], opt.state_dict(),
            getattr(opt, "t", None)), run


def assert_same_optimizer_loop(eager: Any, traced: Any) -> None:
    """Two ``optimizer_loop`` results are equal: losses, parameters, ``t``, groups and state."""
    (losses_a, params_a, opt_a, t_a), (losses_b, params_b, opt_b, t_b) = eager, traced
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert t_a == t_b
    assert [{k: v for k, v in g.items()} for g in opt_a["param_groups"]] == opt_b["param_groups"]
    for key, state in opt_a["state"].items():
        for name, value in state.items():
            other = opt_b["state"][key][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


def two_heads_adam(foreach: bool | None) -> Callable[[], tuple[nn.Module, Any]]:
    """``make()`` for ``assert_bitwise_against_eager``: Adam (``foreach`` as given; None: torch's
    default for the device) over two heads, the second used only when the call's third argument is
    true, so that its step count falls behind the first's after being equal at capture."""
    def make() -> tuple[nn.Module, Any]:
        model = nn.ModuleList([nn.Linear(8, 1), nn.Linear(8, 1)])
        opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=foreach)

        def step(x: torch.Tensor, y: torch.Tensor, both: bool) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            out = model[0](x) + (model[1](x) if both else 0)
            loss = F.mse_loss(out, y)
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


class SmoothedValue:
    """torchvision's reference ``SmoothedValue``, as far as ``update`` goes: a window of recent values
    (a ``deque`` with ``maxlen``) and running totals."""

    def __init__(self, window_size: int = 20) -> None:
        self.deque: deque[float] = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0

    def update(self, value: float, n: int = 1) -> None:
        self.deque.append(value)
        self.count += n
        self.total += value * n
