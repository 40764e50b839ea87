"""Cost formulas of fused recurrent kernels (LSTM, GRU, plain RNN) and their backward.

On CPU ``nn.LSTM`` runs one ``mkldnn_rnn_layer`` per layer and direction; on
CUDA one ``_cudnn_rnn`` for the whole stack; step-by-step cells use
``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell``. Their work is dominated by
matmuls: every weight matrix ``W`` (rows = gates x hidden) is applied to the
input or hidden vector of every time step of every sequence, ``2 * steps *
numel(W)`` FLOPs, plus one add per bias element per step, plus the cell's
elementwise work per hidden unit per step (gate sums, sigmoids at 4, tanh at
1, the state update):

- LSTM: 4 gate sums + 3 sigmoids + 1 tanh, c' = f*c + i*g (3), h' = o*tanh(c') (2): 22
- GRU: 3 gate sums + 2 sigmoids, n = tanh(i_n + r*h_n) (2), h' = (1-z)*n + z*h (4): 17
- RNN (tanh or relu): the sum of the two contributions and the activation: 2

Backward does each matmul twice (gradient of the input or hidden state, and
of the weight) and about twice the elementwise work.
"""

from __future__ import annotations

from typing import Any

import torch

from graphprof.passes.cost_formulas import OpCall, builtin, cost, numel, tensors_in
from graphprof.passes.records import CostRecord

#: Elementwise FLOPs per hidden unit per step, by the cuDNN/oneDNN mode enum.
CELL_FLOPS = {0: 2, 1: 2, 2: 22, 3: 17}  # RNN_RELU, RNN_TANH, LSTM, GRU
_LSTM = 2


def _rnn_forward_flops(steps: int, weights: list[torch.Tensor], mode: int, hidden: int) -> int:
    matrices = [w for w in weights if w.dim() == 2]
    biases = [w for w in weights if w.dim() == 1]
    layers_directions = max(len(matrices) // 2, 1)  # an input and a hidden matrix each
    return (2 * steps * sum(numel(m) for m in matrices) + steps * sum(numel(b) for b in biases)
            + steps * hidden * layers_directions * CELL_FLOPS.get(int(mode), 2))


def _steps(x: torch.Tensor) -> int:
    """Time steps x sequences: every element of the input but its feature dimension."""
    return numel(x) // max(int(x.shape[-1]), 1) if x.dim() else 1


def _weights(call: OpCall, names: tuple[str, ...]) -> list[torch.Tensor]:
    return [t for name in names for t in tensors_in(call.arg(name))]


@builtin("mkldnn_rnn_layer")
def _mkldnn_rnn(call: OpCall) -> CostRecord:
    weights = _weights(call, ("weight0", "weight1", "weight2", "weight3")) if call.arg("has_biases") \
        else _weights(call, ("weight0", "weight1"))
    return cost(call, _rnn_forward_flops(_steps(call.arg("input")), weights, call.arg("mode"),
                                         int(call.arg("hidden_size"))))


@builtin("mkldnn_rnn_layer_backward")
def _mkldnn_rnn_backward(call: OpCall) -> CostRecord:
    weights = _weights(call, ("weight1", "weight2", "weight3", "weight4")) if call.arg("has_biases") \
        else _weights(call, ("weight1", "weight2"))
    forward = _rnn_forward_flops(_steps(call.arg("input")), weights, call.arg("mode"), int(call.arg("hidden_size")))
    return cost(call, 2 * forward)


def _cudnn_like(call: OpCall, backward: bool) -> int:
    steps = _steps(call.arg("input"))
    forward = _rnn_forward_flops(steps, _weights(call, ("weight",)), call.arg("mode"), int(call.arg("hidden_size")))
    return 2 * forward if backward else forward


@builtin(["_cudnn_rnn", "miopen_rnn"])
def _cudnn_rnn(call: OpCall) -> CostRecord:
    return cost(call, _cudnn_like(call, backward=False))


@builtin(["_cudnn_rnn_backward", "miopen_rnn_backward"])
def _cudnn_rnn_backward(call: OpCall) -> CostRecord:
    return cost(call, _cudnn_like(call, backward=True))


def _cell(state: Any, gates: int, per_unit: int, with_bias: bool) -> int:
    units = numel(state)
    return units * per_unit + (2 * gates * units if with_bias else 0)


@builtin("_thnn_fused_lstm_cell")
def _lstm_cell(call: OpCall) -> CostRecord:
    """The gates come from matmuls outside the cell (their own nodes): elementwise work only."""
    return cost(call, _cell(call.arg("cx"), 4, CELL_FLOPS[_LSTM], call.arg("input_bias") is not None))


@builtin("_thnn_fused_gru_cell")
def _gru_cell(call: OpCall) -> CostRecord:
    return cost(call, _cell(call.arg("hx"), 3, CELL_FLOPS[3], call.arg("input_bias") is not None))


@builtin(["_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_lstm_cell_backward"])
def _lstm_cell_backward(call: OpCall) -> CostRecord:
    return cost(call, 2 * _cell(call.arg("cx"), 4, CELL_FLOPS[_LSTM], bool(call.arg("has_bias"))))


@builtin("_thnn_fused_gru_cell_backward")
def _gru_cell_backward(call: OpCall) -> CostRecord:
    """grad_hy has the hidden state's shape."""
    return cost(call, 2 * _cell(call.arg("grad_hy"), 3, CELL_FLOPS[3], bool(call.arg("has_bias"))))
