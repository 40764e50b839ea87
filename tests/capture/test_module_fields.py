"""What a module keeps besides tensors: a config's fields, its own counters, a mode it switches.

Each scenario builds the same model twice from one seed, changes both
copies the same way, and compares the eager copy with the traced one after
every call: results, parameters, and the Python values the modules keep.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphprof
from graphprof.capture.assigned_numbers import AssignedNumbers


@dataclass
class _Config:
    act: str = "tanh"
    scale: float = 1.0


class _Counters:
    def __init__(self) -> None:
        self.forwards = 0


class _Net(nn.Module):
    """Reads a config it keeps (nanoGPT-style ``self.config``), counts its calls, switches a mode."""

    def __init__(self, config: _Config, decides_on: str) -> None:
        super().__init__()
        self.decides_on = decides_on  # what forward branches on besides the config: "calls", "mode" or ""
        self.config = config
        self.counters = _Counters()
        self.calls = 0
        self.mode = "a"
        self.l1, self.l2 = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.counters.forwards += 1
        if self.decides_on == "mode":
            self.mode = "b" if self.mode == "a" else "a"
        if self.decides_on == "calls" and self.calls % 3 == 0:
            x = x * 2
        h = self.l1(x)
        h = torch.tanh(h) if self.config.act == "tanh" else torch.relu(h)
        out = self.l2(h) * self.config.scale
        return -out if self.decides_on == "mode" and self.mode == "b" else out


def _compare(change: Callable[[int, _Net], None], calls: int = 9,
             decides_on: str = "") -> graphprof.tracing.TracedFunction:
    def make() -> tuple[_Net, Callable[..., torch.Tensor]]:
        torch.manual_seed(0)
        net = _Net(_Config(), decides_on)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            return loss
        return net, step

    (eager_net, eager), (net, step) = make(), make()
    traced = graphprof.trace(step)
    for i in range(calls):
        change(i, eager_net)
        change(i, net)
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(eager(x, y), traced(x, y)), f"loss differs on call {i}"
        for a, b in zip(eager_net.parameters(), net.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
        kept = lambda n: (n.calls, n.counters.forwards, n.mode, n.config)  # noqa: E731
        assert kept(eager_net) == kept(net), f"kept values differ after call {i}"
    return traced


def test_a_config_the_module_keeps_changed_between_calls() -> None:
    def change(i: int, net: _Net) -> None:
        if i == 4:
            net.config.act = "relu"
        if i == 6:
            net.config.scale = 2.0

    traced = _compare(change)
    assert traced.capture_mode == "whole-step"


def test_a_module_counting_its_calls_counts_on_every_replay() -> None:
    """The count is a constant in the capture call; after one more capture it is an input."""
    traced = _compare(lambda i, net: None, calls=14, decides_on="calls")
    assert traced.capture_mode == "whole-step"
    # The first capture finds the counters assigned; then at most one per path of ``calls % 3``
    # (a count replayed as a constant would capture on every call, and stop at the storm limit).
    assert traced.captures <= 4


def test_a_mode_the_module_switches_on_every_call() -> None:
    """A string assigned from a constant is held by its value: one graph per mode, each replayed."""
    traced = _compare(lambda i, net: None, calls=10, decides_on="mode")
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 3  # the first finds the counters and the mode assigned; then one per mode


def test_the_reason_names_the_config_field(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="graphprof"):
        _compare(lambda i, net: setattr(net.config, "act", "relu") if i == 5 else None, calls=7)
    assert any("net.config.act changed from 'tanh' to 'relu'" in r.getMessage() for r in caplog.records)


def test_a_hugging_face_config_field_changed_between_calls() -> None:
    """``output_hidden_states`` switched on after warm-up: the step returns what eager returns."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()

    def make() -> Callable[..., Any]:
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=32, num_labels=3)
        model = transformers.BertForSequenceClassification(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
            opt.zero_grad()
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
            opt.step()
            return out.loss.detach(), 0 if out.hidden_states is None else len(out.hidden_states)
        step.model = model  # type: ignore[attr-defined]
        return step

    eager, step = make(), make()
    traced = graphprof.trace(step)
    for i in range(6):
        if i == 3:
            eager.model.config.output_hidden_states = step.model.config.output_hidden_states = True  # type: ignore[attr-defined]
        g = torch.Generator().manual_seed(i)
        ids, labels = torch.randint(0, 64, (2, 8), generator=g), torch.randint(0, 3, (2,), generator=g)
        torch.manual_seed(10 + i)
        expected = eager(ids, labels)
        torch.manual_seed(10 + i)
        got = traced(ids, labels)
        assert torch.equal(expected[0], got[0]) and expected[1] == got[1], f"call {i}: {expected} vs {got}"
    # The call that switches it on installs transformers' hooks that collect the hidden states (once, behind
    # a flag): its graph is not kept, and the next call's is (capture/registered_hooks.py).
    assert traced.capture_mode == "whole-step" and traced.captures == 3


def test_noted_fields_go_with_their_owner() -> None:
    numbers = AssignedNumbers()
    owner = _Counters()
    numbers.add(owner, "forwards")
    assert (owner, "forwards") in numbers and (owner, "other") not in numbers
    assert (_Counters(), "forwards") not in numbers  # another object, if it were given the same id
    del owner
    gc.collect()
    assert not numbers._keys
    numbers.add({}, "x")  # a dict cannot be weakly referenced: not noted, and no error
    assert not numbers._keys


class _Normaliser(nn.Module):
    """Keeps a running mean as a buffer it replaces (not updates in place) on every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mean = 0.9 * self.mean + 0.1 * x.mean(0)
        return self.linear(x - self.mean)


@pytest.mark.parametrize("reset_at", [None, 4])
def test_a_buffer_the_forward_replaces_is_read_and_replaced_on_every_replay(reset_at: int | None) -> None:
    def make() -> tuple[_Normaliser, Callable[..., torch.Tensor]]:
        torch.manual_seed(0)
        net = _Normaliser()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return net, step

    (eager_net, eager), (net, step) = make(), make()
    traced = graphprof.trace(step)
    for i in range(8):
        if i == reset_at:  # the loop resets the statistics between calls
            eager_net.mean = torch.zeros(4)
            net.mean = torch.zeros(4)
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        assert torch.equal(eager(x, y), traced(x, y)), f"loss differs on call {i}"
        assert torch.equal(eager_net.mean, net.mean), f"the buffer differs after call {i}"
        for a, b in zip(eager_net.parameters(), net.parameters()):
            assert torch.equal(a, b), f"parameters differ after call {i}"
    # The graph reads this buffer where it is kept: one the loop assigns in its place is read as it is
    # (its type, shape and dtype still held), not a change of the module (capture/module_structure.py).
    assert traced.capture_mode == "whole-step" and traced.captures == 1


def _in_a_list() -> tuple[Any, Callable[..., torch.Tensor]]:
    layers = [nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)]  # a plain list, not an nn.ModuleList
    opt = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        h = x
        for layer in layers:
            h = layer(h)
        loss = F.mse_loss(h, y)
        loss.backward()
        opt.step()
        return loss.detach()
    return layers, step


def _in_a_dict() -> tuple[Any, Callable[..., torch.Tensor]]:
    nets = {"body": nn.Linear(4, 8), "drop": nn.Dropout(0.5), "head": nn.Linear(8, 1)}
    opt = torch.optim.SGD([p for net in nets.values() for p in net.parameters()], lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(nets["head"](nets["drop"](nets["body"](x))), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return list(nets.values()), step


@pytest.mark.parametrize("make", [_in_a_list, _in_a_dict])
@pytest.mark.parametrize("change", ["eval", "p"])
def test_modules_kept_in_a_plain_list_or_dict_are_watched(make: Callable[[], Any], change: str) -> None:
    """Switching such a dropout to eval mode, or changing its ``p``, captures again."""
    torch.manual_seed(0)
    eager_layers, eager = make()
    torch.manual_seed(0)
    layers, step = make()
    traced = graphprof.trace(step)
    for i in range(6):
        if i == 3:
            for mods in (eager_layers, layers):
                mods[1].eval() if change == "eval" else setattr(mods[1], "p", 0.1)
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)
        torch.manual_seed(100 + i)
        expected = eager(x, y)
        torch.manual_seed(100 + i)
        assert torch.equal(expected, traced(x, y)), f"loss differs on call {i}"
        for a, b in zip(eager_layers, layers):
            for p, q in zip(a.parameters(), b.parameters()):
                assert torch.equal(p, q), f"parameters differ after call {i}"
    assert traced.capture_mode == "whole-step" and traced.captures == 2
