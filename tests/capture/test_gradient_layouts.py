"""Segments hand a compiled backward each gradient in the layout eager's autograd hands it.

wav2vec2's positional convolution: a grouped convolution, its last time step
dropped, a GELU and a transpose back, compiled as a graph of its own when
layerdrop (a random draw in the encoder's loop of layers) makes dynamo run
the encoder's own frame eagerly. Its output is transposed; the gradient that
eager's add hands back to it is contiguous. AOTAutograd copied that gradient
into the output's layout before the compiled backward ran, and CPU's GELU
backward on the copy took another loop (vectorized, not element by element)
than eager's on the transposed gradient: parameters differed from eager's in
the last bits from the first call, with no warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch._aot_autograd.schemas import MemoryFormatMeta, PlainTensorMeta

from graphprof.capture.gradient_layouts import AOTDispatchAutograd, eager_gradient_layouts
from tests.helpers import assert_bitwise_against_eager


class _PositionalConv(nn.Module):
    """Conv1d over time, its last step dropped, GELU, back to (batch, time, channels): a transposed output."""

    def __init__(self, weight_norm: bool) -> None:
        super().__init__()
        self.conv = nn.Conv1d(16, 16, kernel_size=4, padding=2, groups=4)
        if weight_norm:
            self.conv = nn.utils.parametrizations.weight_norm(self.conv, name="weight", dim=2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.conv(h.transpose(1, 2))[:, :, :-1]).transpose(1, 2)


class _Encoder(nn.Module):
    def __init__(self, weight_norm: bool) -> None:
        super().__init__()
        self.features = nn.Conv1d(1, 16, kernel_size=5, stride=3)
        self.position = _PositionalConv(weight_norm)
        self.norm = nn.LayerNorm(16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 8)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.features(audio.unsqueeze(1))).transpose(1, 2)
        h = self.norm(h + self.position(h))
        for layer in self.layers:
            if torch.rand([]) < 0.3:  # layerdrop: dynamo runs this frame eagerly, the modules it calls compiled
                continue
            h = torch.tanh(layer(h))
        return self.head(h)


def _make(weight_norm: bool) -> Callable[[], tuple[nn.Module, Callable[..., Any]]]:
    def make() -> tuple[nn.Module, Callable[..., Any]]:
        model = _Encoder(weight_norm).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(audio: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(audio).flatten(0, 1), target.flatten())
            loss.backward()
            opt.step()
            return loss.detach()
        return model, step
    return make


def _inputs(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(2, 200, generator=g), torch.randint(0, 8, (2, 66), generator=g)


@pytest.mark.parametrize("weight_norm", [False, True], ids=["conv", "weight-norm-conv"])
@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_a_transposed_output_gets_its_gradient_as_eager_hands_it(weight_norm: bool, capture: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one warning is tested elsewhere
        traced = assert_bitwise_against_eager(_make(weight_norm), _inputs, 5, capture=capture, profiling=True)
    assert traced.capture_mode == "segments"


def test_only_graphs_compiled_inside_take_gradients_as_they_come() -> None:
    """The user's own torch.compile graphs keep AOTAutograd's handling: the handler is swapped back, also
    after a compile that raised."""
    own = AOTDispatchAutograd.__dict__["process_runtime_tangent"]
    transposed, meta = torch.randn(3, 4).t(), _plain_meta(4, 3)
    with pytest.raises(RuntimeError), eager_gradient_layouts():
        assert AOTDispatchAutograd.process_runtime_tangent(transposed, meta)[0] is transposed
        raise RuntimeError("a compile that failed")
    assert AOTDispatchAutograd.__dict__["process_runtime_tangent"] is own
    restrided = AOTDispatchAutograd.process_runtime_tangent(transposed, meta)[0]
    assert restrided.is_contiguous() and torch.equal(restrided, transposed)

def _plain_meta(*size: int) -> Any:
    return PlainTensorMeta(0, memory_format=MemoryFormatMeta(size=size, stride=(size[1], 1)))
