"""Segments add the gradients of a tensor read in several compiled graphs as eager adds them.

An encoder's output read twice by each layer of a decoder whose layers a
random draw skips (layerdrop): the step runs as torch.compile segments, each
layer a graph of its own. Its compiled backward used to return the sum of
the two reads, and autograd added such sums layer by layer, another rounding
than eager's one read at a time: last-bit differences from the first call.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.fx
from torch import nn

from graphprof.capture.gradient_uses import split_gradient_uses
from tests.helpers import assert_bitwise_against_eager


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.norm = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, h: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.norm(h + torch.tanh(self.q(h)) * self.k(memory) + self.v(memory))


class _Decoder(nn.Module):
    """Every layer reads the encoder's output twice; ``tied`` reads the embedding's weight in the head too."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed, self.encode = nn.Embedding(50, 16), nn.Linear(16, 16)
        self.layers = nn.ModuleList([_Layer() for _ in range(4)])
        self.head = nn.Linear(16, 50)
        self.tied = tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = torch.tanh(self.encode(self.embed(x)))
        h = self.embed(x)
        for layer in self.layers:
            if torch.rand([]) < 0.3:  # layerdrop: no static graph, one compiled graph per layer
                continue
            h = layer(h, memory)
        logits = self.head(h)
        return logits + h @ self.embed.weight.T if self.tied else logits


def _make(tied: bool) -> Callable[[], tuple[nn.Module, Callable[..., Any]]]:
    def make() -> tuple[nn.Module, Callable[..., Any]]:
        model = _Decoder(tied).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 50, (4, 8), generator=g)


@pytest.mark.parametrize("tied", [False, True], ids=["encoder-output", "and-tied-weight"])
@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_reads_in_several_graphs_sum_as_eager(tied: bool, capture: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one warning is tested elsewhere
        traced = assert_bitwise_against_eager(_make(tied), _inputs, 6, capture=capture, profiling=True)
    assert traced.capture_mode == "segments"



def test_each_read_gets_an_input_last_read_first() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * torch.cos(x) + x @ w

    gm = torch.fx.symbolic_trace(f)
    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    split = split_gradient_uses(gm, [x, w])
    assert split is not None
    copied, examples, inputs = split
    assert inputs.sources == (0, 0, 0, 1)
    assert [e is x for e in examples] == [True, False, False, False] and examples[1].shape == x.shape
    names = [n.name for n in copied.graph.nodes if n.op == "placeholder"]
    readers = {n.target.__name__: [a.name for a in n.args if isinstance(a, torch.fx.Node)]
               for n in copied.graph.nodes if n.op == "call_function" and n.target in (torch.sin, torch.cos)}
    assert readers == {"sin": [names[2]], "cos": [names[1]]}  # the first read takes the last input of the three
    assert torch.equal(copied(*inputs.expand([x, w])), f(x, w))
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x", "w"]  # dynamo's graph unchanged


def test_graphs_that_write_in_place_or_need_no_gradient_are_left_alone() -> None:
    def writes(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(x)
        return y

    def reads(x: torch.Tensor) -> torch.Tensor:
        return x * x + x

    x = torch.randn(3, requires_grad=True)
    assert split_gradient_uses(torch.fx.symbolic_trace(writes), [x]) is None
    assert split_gradient_uses(torch.fx.symbolic_trace(reads), [x.detach()]) is None
    assert split_gradient_uses(torch.fx.symbolic_trace(reads), [x]) is not None
