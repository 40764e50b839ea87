"""Segments of a mixture-of-experts step give eager's gradients bit for bit.

A block that routes each token to its experts by data (``torch.where`` on
the router's choice, one loop iteration per expert, ``index_add_`` into the
output, as Hugging Face's Mixtral and Qwen2-MoE with eager experts) has no
static graph: it runs as torch.compile segments. Its RMSNorm reads its
input through ``x.to(torch.float32)``, which hands back ``x`` itself, so
eager adds the gradients of that norm's two reads to the block's input one
by one, next to the residual's read in a later graph. The compiled graph
saw one read (of the ``to``), and added the two inside its backward first:
parameters differed from eager's in the last bits from the first call,
without a warning.
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

_EXPERTS, _TOP = 4, 2


class _RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.to(torch.float32)  # ``h`` itself: eager's reads below are reads of ``h``
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(h.dtype)


class _Experts(nn.Module):
    """A router's top two of four experts per token, one loop iteration per expert the batch uses; with
    ``shared``, an expert every token goes through too (Qwen2-MoE's), reading the same view of the input."""

    def __init__(self, size: int, shared: bool) -> None:
        super().__init__()
        self.router = nn.Linear(size, _EXPERTS, bias=False)
        self.up = nn.Parameter(torch.randn(_EXPERTS, 2 * size, size) * 0.2)
        self.down = nn.Parameter(torch.randn(_EXPERTS, size, 2 * size) * 0.2)
        self.gate, self.lift = (nn.Linear(size, size), nn.Linear(size, size)) if shared else (None, None)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.view(-1, h.shape[-1])
        shared = nn.functional.silu(self.gate(x)) * self.lift(x) if self.gate is not None and self.lift is not None else 0
        weights, chosen = torch.topk(self.router(x).softmax(-1), _TOP, dim=-1)
        out = torch.zeros_like(x)
        with torch.no_grad():
            mask = nn.functional.one_hot(chosen, _EXPERTS).permute(2, 1, 0)
            used = (mask.sum(dim=(-1, -2)) > 0).nonzero()
        for expert in used:
            expert = expert[0]
            slot, token = torch.where(mask[expert])
            y = nn.functional.linear(nn.functional.silu(nn.functional.linear(x[token], self.up[expert])),
                                     self.down[expert])
            out.index_add_(0, token, y * weights[token, slot, None])
        return (out + shared).reshape(h.shape)


class _Model(nn.Module):
    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.norms = nn.ModuleList([_RMSNorm(16) for _ in range(2)])
        self.blocks = nn.ModuleList([_Experts(16, shared) for _ in range(2)])
        self.head = nn.Linear(16, 40)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for norm, block in zip(self.norms, self.blocks):
            h = h + block(norm(h))
        return self.head(h)


def _make(shared: bool) -> Callable[[], tuple[nn.Module, Callable[..., Any]]]:
    def make() -> tuple[nn.Module, Callable[..., Any]]:
        model = _Model(shared).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randint(0, 40, (2, 8), generator=g), torch.randint(0, 40, (2, 8), generator=g)


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "and-shared-expert"])
def test_expert_loop_segments_match_eager(shared: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one warning is tested elsewhere
        traced = assert_bitwise_against_eager(_make(shared), _inputs, 4, profiling=True)
    assert traced.capture_mode == "segments"


def _dynamo_graph(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The graph dynamo hands a backend for ``fn(*args)``, with its example inputs."""
    seen: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return seen[0]


def test_reads_through_a_to_that_hands_back_its_input_are_reads_of_the_input() -> None:
    def f(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = h.to(torch.float32).contiguous()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)))

    h, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    gm, examples = _dynamo_graph(f, h, w)
    split = split_gradient_uses(gm, examples)
    assert split is not None
    copied, _, inputs = split
    assert inputs.sources == (0, 0, 1)
    names = [n.name for n in copied.graph.nodes if n.op == "placeholder"]
    # Each read has a ``to`` and ``contiguous`` of its own input, the first read (``pow``) the last input.
    chains = {next(iter(node.users)).name: node.args[0].args[0].name for node in copied.graph.nodes
              if node.op == "call_method" and node.target == "contiguous"}
    assert chains == {"pow_1": names[1], "mul": names[0]}
    assert torch.equal(copied(*inputs.expand([h, w]))[0], f(h, w))
