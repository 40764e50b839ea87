"""RNNs captured whole-step and replayed bitwise (capture/grad_mode.py).

On CPU ``nn.LSTM`` runs ``mkldnn_rnn_layer``, whose kernel returns the
workspace its backward needs only while grad mode is on; the replay runs
under ``no_grad``, so without the grad-mode replay the first replay crashed.
Packed sequences are not replayed: the RNN op reads the packed batch sizes
inside C++, so the step falls back to segments, with one warning, bitwise.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import assert_bitwise_against_eager

CALLS = 6


def _rnn_step(kind: str, **options: Any) -> Any:
    def make() -> tuple[nn.Module, Any]:
        rnn = getattr(nn, kind)(8, 16, **{"batch_first": True, **options})
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
    {"num_layers": 3, "bidirectional": True, "dropout": 0.25, "batch_first": False},
], ids=["one-layer", "two-layers-dropout", "bidirectional", "three-layers-time-first"])
def test_rnn_training_steps_replay_bitwise(kind: str, options: dict) -> None:
    traced = assert_bitwise_against_eager(_rnn_step(kind, **options), _inputs, CALLS)  # (3, 5, 8) either way
    assert traced.capture_mode == "whole-step"
    assert traced.captures == 1


def test_lstm_replays_its_layer_with_grad_mode_on_and_records_no_autograd_graph() -> None:
    traced = assert_bitwise_against_eager(_rnn_step("LSTM"), _inputs, 4)
    layers = [n for n in traced.graph_module.graph.nodes if n.target is torch.ops.aten.mkldnn_rnn_layer.default]
    assert layers, "CPU LSTM is expected to run mkldnn_rnn_layer"
    result = traced(*_inputs(9))
    # Eager's flags on the loss its backward used (capture/kept_history.py), and no record of the replayed
    # ops: its node hangs from nothing but an empty leaf.
    assert result.requires_grad and not result.is_leaf
    assert [f.variable.numel() for f, _ in result.grad_fn.next_functions if f is not None] == [0]


def _packed_step() -> tuple[nn.Module, Any]:
    rnn = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    opt = torch.optim.SGD(rnn.parameters(), lr=0.1)

    def step(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=True)
        loss = out.pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    return rnn, step


def test_packed_sequences_fall_back_to_segments_with_one_warning_and_bitwise() -> None:
    lengths = [torch.tensor([5, 3, 4]), torch.tensor([2, 5, 5])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = assert_bitwise_against_eager(_packed_step, lambda i: (*_inputs(i), lengths[i % 2]), 3)
    messages = [str(w.message) for w in caught if "graphprof" in str(w.message)]
    assert len(messages) == 1 and "reads a tensor's value on the host" in messages[0], messages
    assert traced.capture_mode == "segments"
