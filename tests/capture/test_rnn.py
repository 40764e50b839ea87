"""RNNs captured whole-step and replayed bitwise (capture/grad_mode.py).

On CPU ``nn.LSTM`` runs ``mkldnn_rnn_layer``, whose kernel returns the
workspace its backward needs only while grad mode is on; the replay runs
under ``no_grad``, so without the grad-mode replay the first replay crashed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import assert_bitwise_against_eager

CALLS = 6


def _rnn_step(kind: str, **options: Any) -> Any:
    def make() -> tuple[nn.Module, Any]:
        rnn = getattr(nn, kind)(8, 16, batch_first=True, **options)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1, momentum=0.9)

        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            out, _ = rnn(x)
            loss = out.pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return rnn, step

    return make


def _inputs(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(i)),)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("options", [
    {},
    {"num_layers": 2, "dropout": 0.3},
    {"num_layers": 2, "bidirectional": True, "dropout": 0.2},
], ids=["one-layer", "two-layers-dropout", "bidirectional"])
def test_rnn_training_steps_replay_bitwise(kind: str, options: dict) -> None:
    traced = assert_bitwise_against_eager(_rnn_step(kind, **options), _inputs, CALLS)
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_lstm_replays_its_layer_with_grad_mode_on_and_records_no_autograd_graph() -> None:
    traced = assert_bitwise_against_eager(_rnn_step("LSTM"), _inputs, 4)
    layers = [n for n in traced.graph_module.graph.nodes if n.target is torch.ops.aten.mkldnn_rnn_layer.default]
    assert layers, "CPU LSTM is expected to run mkldnn_rnn_layer"
    result = traced(*_inputs(9))
    assert result.grad_fn is None
