"""Cost formulas of neural-network ops: matmul variants torch does not count,
attention on CPU, convolution backward's bytes, softmax and log_softmax,
batch/layer/group/RMS norm and their backward, and losses.

FLOPs follow the defining expression of each op, 1 per elementwise
operation or per element folded into a reduction; ``n`` is the number of
input elements, ``r`` the number of rows (softmax) or normalisation groups.
The expression is in each docstring so the count can be checked by hand.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils.flop_counter as flop_counter

from graphprof.passes.cost_formulas import (
    OpCall, builtin, cost, is_sparse, itemsize, numel, read_bytes, torch_flops,
)
from graphprof.passes.records import CostRecord


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _reads_except(call: OpCall, *skip: Any) -> int:
    """Bytes of the inputs, leaving out arguments the kernel only takes for shape."""
    skipped = {id(s) for s in skip if isinstance(s, torch.Tensor)}
    return read_bytes(t for t in call.inputs if id(t) not in skipped)


# -- matmul and attention -----------------------------------------------------------
@builtin(["dot", "vdot"])
def _dot(call: OpCall) -> CostRecord:
    """n multiply-adds."""
    return cost(call, 2 * numel(call.args[0]))


@builtin(["mv", "addmv"])
def _mv(call: OpCall) -> CostRecord:
    """(m, n) @ (n,): 2*m*n, the bias of addmv not counted (as torch counts addmm)."""
    mat = call.arg("mat") if call.arg("mat") is not None else call.args[0]
    return cost(call, 2 * numel(mat))


@builtin("addbmm")
def _addbmm(call: OpCall) -> CostRecord:
    """sum over b of (m, k) @ (k, n): 2*b*m*n*k (the reduction over b adds ~m*n*b more, not counted)."""
    b, m, k = _shape(call.arg("batch1"))
    n = _shape(call.arg("batch2"))[-1]
    return cost(call, 2 * b * m * n * k)


@builtin("_int_mm")
def _int_mm(call: OpCall) -> CostRecord:
    m, k = _shape(call.args[0])
    return cost(call, 2 * m * k * _shape(call.args[1])[-1])


_WITH_BIAS = ("aten::addmm", "aten::_sparse_addmm", "aten::sspaddmm")


@builtin(["mm", "addmm", "_sparse_addmm", "_sparse_mm", "smm", "hspmm", "sspaddmm"])
def _matmul(call: OpCall) -> CostRecord | None:
    """Dense (m, k) @ (k, n): torch's 2*m*k*n. With one sparse operand: 2 FLOPs per stored element of
    the sparse one and per column (row) of the dense one it meets, bytes of the sparse one's indices and
    values read (as many as the matrix the capture call read stores). None (cost unknown) where an
    operand's value is not known (a sparse argument of the step: make_fx keeps no value of it, and one
    graph replays arguments that store any number of elements) or both are sparse (the work depends on
    where they meet)."""
    schema = call.target._schema.name if hasattr(call.target, "_schema") else ""
    a, b = call.args[1:3] if schema in _WITH_BIAS else call.args[:2]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or (is_sparse(a) and is_sparse(b)):
        return None
    if is_sparse(a):
        return cost(call, 2 * _stored(a) * int(b.shape[-1]))
    if is_sparse(b):
        return cost(call, 2 * _stored(b) * int(a.shape[0]))
    return cost(call, torch_flops(call))


def _stored(t: torch.Tensor) -> int:
    """Values a sparse tensor stores (its stored elements, times a hybrid tensor's dense part)."""
    return numel(t._values() if t.layout is torch.sparse_coo else t.values())


@builtin(["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"])
def _sdpa_cpu(call: OpCall) -> CostRecord:
    """torch's SDPA formula (its two matmuls); FlopCounterMode does not map the CPU kernel to it."""
    q, k, v = call.args[:3]
    return cost(call, flop_counter.sdpa_flop_count(_shape(q), _shape(k), _shape(v)))


@builtin(["_scaled_dot_product_flash_attention_for_cpu_backward",
          "_scaled_dot_product_fused_attention_overrideable_backward"])
def _sdpa_cpu_backward(call: OpCall) -> CostRecord:
    grad_out, q, k, v = call.args[:4]
    return cost(call, flop_counter.sdpa_backward_flop_count(_shape(grad_out), _shape(q), _shape(k), _shape(v)))


def _channels_first(shape: tuple[int, ...]) -> list[int]:
    return [shape[1], shape[0], *shape[2:]]


@builtin("convolution_backward")
def _conv_backward(call: OpCall) -> CostRecord:
    """torch's FLOPs, corrected for groups; the input is read only for
    grad_weight, the weight only for grad_input.

    torch's formula counts grad_weight of a grouped convolution as if every
    input channel met every output channel: ``groups`` times the work (its
    grad_input and forward counts are right). The grouped convolution is
    ``groups`` independent ones, so the excess is taken off.
    """
    grad_input, grad_weight, _ = call.arg("output_mask", [True, True, True])
    flops = torch_flops(call)
    groups = int(call.arg("groups", 1))
    if grad_weight and groups > 1:
        g, x, w = (_shape(call.arg(name)) for name in ("grad_output", "input", "weight"))
        lhs, rhs = (g, x) if call.arg("transposed") else (x, g)
        counted = flop_counter.conv_flop_count(_channels_first(lhs), _channels_first(rhs), _channels_first(w))
        flops -= counted - counted // groups
    skip = [] if grad_weight else [call.arg("input")]
    skip += [] if grad_input else [call.arg("weight")]
    return cost(call, flops, bytes_read=_reads_except(call, *skip))


# -- softmax ---------------------------------------------------------------------------
def _rows(t: torch.Tensor, dim: int) -> int:
    size = int(t.shape[dim]) if t.dim() else 1
    return numel(t) // max(size, 1)


@builtin(["_softmax", "_safe_softmax", "softmax", "special_softmax"])
def _softmax(call: OpCall) -> CostRecord:
    """exp(x - max) / sum(exp(x - max)): max 1, sub 1, exp 1, sum 1, div 1 = 5n."""
    return cost(call, 5 * numel(call.args[0]))


@builtin(["_log_softmax", "log_softmax", "special_log_softmax"])
def _log_softmax(call: OpCall) -> CostRecord:
    """(x - max) - log(sum(exp(x - max))): max 1, sub 1, exp 1, sum 1, sub 1 = 5n, plus r logs."""
    x = call.args[0]
    return cost(call, 5 * numel(x) + _rows(x, int(call.arg("dim"))))


@builtin("_softmax_backward_data")
def _softmax_backward(call: OpCall) -> CostRecord:
    """y * (g - sum(g * y)): mul 1, sum 1, sub 1, mul 1 = 4n."""
    return cost(call, 4 * numel(call.args[0]))


@builtin("_log_softmax_backward_data")
def _log_softmax_backward(call: OpCall) -> CostRecord:
    """g - exp(y) * sum(g): sum 1, exp 1, mul 1, sub 1 = 4n."""
    return cost(call, 4 * numel(call.args[0]))


# -- normalisation -----------------------------------------------------------------------
def norm_forward_flops(n: int, rows: int, weight: bool, bias: bool) -> int:
    """Normalise n elements in ``rows`` groups with batch statistics.

    mean (1 add per element), variance (sub, square, add: 3), per group
    mean and variance divides, + eps and rsqrt (4 per group), normalise
    (sub, mul: 2), then * weight and + bias (1 each): 6n + 4r + affine.
    """
    return 6 * n + 4 * rows + (n if weight else 0) + (n if bias else 0)


def norm_backward_flops(n: int, rows: int, weight: bool, mask: Any) -> int:
    """Backward of a normalisation with batch statistics.

    xhat = (x - mean) * rstd recomputed (2n) when grad_input or grad_weight
    is wanted; grad_input = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
    with gw = g * weight: (1n if weight) + sum 1, mul 1, sum 1, mul 1,
    sub 2, mul 1 = 7n + 2r; grad_weight = sum(g * xhat): 2n; grad_bias = sum(g): n.
    """
    want_input, want_weight, want_bias = (bool(m) for m in mask)
    flops = 2 * n if (want_input or want_weight) else 0
    if want_input:
        flops += (n if weight else 0) + 7 * n + 2 * rows
    if want_weight and weight:
        flops += 2 * n
    if want_bias:
        flops += n
    return flops


@builtin("native_layer_norm")
def _layer_norm(call: OpCall) -> CostRecord:
    x = call.args[0]
    rows = numel(x) // max(math.prod(call.arg("normalized_shape")), 1)
    w, b = call.arg("weight"), call.arg("bias")
    return cost(call, norm_forward_flops(numel(x), rows, w is not None, b is not None))


@builtin("native_layer_norm_backward")
def _layer_norm_backward(call: OpCall) -> CostRecord:
    x = call.arg("input")
    rows = numel(x) // max(math.prod(call.arg("normalized_shape")), 1)
    w = call.arg("weight")
    flops = norm_backward_flops(numel(x), rows, w is not None, call.arg("output_mask"))
    return cost(call, flops, bytes_read=_reads_except(call, call.arg("bias")))


def _channels(x: torch.Tensor) -> int:
    return int(x.shape[1]) if x.dim() > 1 else 1


_BN_TRAINING_BY_NAME = {
    "_native_batch_norm_legit_no_training": False, "_batch_norm_no_update": False,
    "_batch_norm_with_update": True, "_batch_norm_with_update_functional": True,
}


def _bn_training(call: OpCall) -> bool:
    name = call.target.overloadpacket.__name__
    if name in _BN_TRAINING_BY_NAME:
        return _BN_TRAINING_BY_NAME[name]
    for arg in ("training", "train", "update"):
        value = call.arg(arg)
        if value is not None:
            return bool(value)
    return True


@builtin(["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
          "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_with_update_functional",
          "_batch_norm_no_update", "cudnn_batch_norm", "miopen_batch_norm"])
def _batch_norm(call: OpCall) -> CostRecord:
    """Training: statistics per channel (norm_forward_flops) and the running
    statistics update, lerp of mean and of unbiased variance: 7 per channel.
    Evaluation: rsqrt(var + eps) per channel (2c), normalise 2n, affine."""
    x = call.args[0]
    n, c = numel(x), _channels(x)
    w, b = call.arg("weight") is not None, call.arg("bias") is not None
    if _bn_training(call):
        running = isinstance(call.arg("running_mean"), torch.Tensor)
        flops = norm_forward_flops(n, c, w, b) + (7 * c if running else 0)
    else:
        flops = 2 * c + 2 * n + (n if w else 0) + (n if b else 0)
    return cost(call, flops)


@builtin(["native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward",
          "miopen_batch_norm_backward"])
def _batch_norm_backward(call: OpCall) -> CostRecord:
    """Training: norm_backward_flops per channel. Evaluation: grad_input =
    g * weight * invstd (2n, 1n without weight) with invstd per channel (2c)."""
    x, w = call.arg("input"), call.arg("weight")
    n, c = numel(x), _channels(x)
    mask = call.arg("output_mask", [True, True, True])
    if _bn_training(call):
        flops = norm_backward_flops(n, c, w is not None, mask)
    else:
        want_input, want_weight, want_bias = (bool(m) for m in mask)
        flops = (2 * c + (2 * n if w is not None else n)) if want_input else 0
        flops += (4 * n if want_weight else 0) + (n if want_bias else 0)  # xhat 2n + g*xhat, sum
    return cost(call, flops)


@builtin("native_group_norm")
def _group_norm(call: OpCall) -> CostRecord:
    x = call.args[0]
    rows = int(call.arg("N")) * int(call.arg("group"))
    return cost(call, norm_forward_flops(numel(x), rows, call.arg("weight") is not None, call.arg("bias") is not None))


@builtin("native_group_norm_backward")
def _group_norm_backward(call: OpCall) -> CostRecord:
    x = call.arg("input")
    rows = int(call.arg("N")) * int(call.arg("group"))
    return cost(call, norm_backward_flops(numel(x), rows, call.arg("weight") is not None, call.arg("output_mask")))


@builtin("_fused_rms_norm")
def _rms_norm(call: OpCall) -> CostRecord:
    """x * rsqrt(mean(x*x) + eps) * weight: square 1, sum 1, per row div, +eps,
    rsqrt (3r), mul 1, weight 1: 3n + 3r (+n with weight)."""
    x = call.args[0]
    rows = numel(x) // max(math.prod(call.arg("normalized_shape")), 1)
    return cost(call, 3 * numel(x) + 3 * rows + (numel(x) if call.arg("weight") is not None else 0))


@builtin("_fused_rms_norm_backward")
def _rms_norm_backward(call: OpCall) -> CostRecord:
    """xhat = x * rstd (n); grad_input = rstd * (gw - xhat * mean(gw * xhat)):
    (n if weight) + mul, sum, mul, sub, mul = 5n + r; grad_weight = sum(g * xhat): 2n."""
    x = call.arg("input")
    n = numel(x)
    rows = n // max(math.prod(call.arg("normalized_shape")), 1)
    want_input, want_weight = (bool(m) for m in call.arg("output_mask", [True, True]))
    weight = call.arg("weight") is not None
    flops = n + ((n if weight else 0) + 5 * n + rows if want_input else 0) + (2 * n if want_weight else 0)
    return cost(call, flops)


# -- losses --------------------------------------------------------------------------------
_MEAN = 1  # torch's Reduction.MEAN


@builtin(["nll_loss_forward", "nll_loss2d_forward"])
def _nll_loss(call: OpCall) -> CostRecord:
    """-sum(w[t] * x[t]) / sum(w[t]): one add per target (2 more with weights: multiply,
    and the weight total), one divide for the mean. Reads the targets and one
    element of the input per target, not the whole input."""
    x, target, weight = call.args[0], call.arg("target"), call.arg("weight")
    count = numel(target)
    flops = count * (3 if weight is not None else 1) + (1 if call.arg("reduction") == _MEAN else 0)
    read = read_bytes([target] + ([weight] if weight is not None else [])) + count * itemsize(x)
    return cost(call, flops, bytes_read=read)


@builtin(["nll_loss_backward", "nll_loss2d_backward"])
def _nll_loss_backward(call: OpCall) -> CostRecord:
    """grad_input[t] = -g * w[t] / total_weight: 1 per target (2 with weights), written
    into a zeroed tensor; the input itself is not read (only its shape)."""
    count = numel(call.arg("target"))
    flops = count * (2 if call.arg("weight") is not None else 1)
    return cost(call, flops, bytes_read=_reads_except(call, call.arg("self")))


def _reduced(call: OpCall, n: int) -> int:
    """FLOPs of reducing n loss terms: n adds unless reduction='none', +1 divide for the mean."""
    reduction = call.arg("reduction", _MEAN)
    return 0 if reduction == 0 else n + (1 if reduction == _MEAN else 0)


@builtin("mse_loss")
def _mse(call: OpCall) -> CostRecord:
    """(x - y)^2: 2n, then the reduction."""
    n = numel(call.args[0])
    return cost(call, 2 * n + _reduced(call, n))


@builtin("mse_loss_backward")
def _mse_backward(call: OpCall) -> CostRecord:
    """2 * (x - y) * g / N: sub, mul, mul = 3n."""
    return cost(call, 3 * numel(call.arg("self")))


@builtin(["smooth_l1_loss", "huber_loss"])
def _smooth_l1(call: OpCall) -> CostRecord:
    """d = x - y; |d| < b ? 0.5*d*d/b : |d| - 0.5*b: sub, abs, compare, 2 muls, div, select = 7n."""
    n = numel(call.args[0])
    return cost(call, 7 * n + _reduced(call, n))


@builtin(["smooth_l1_loss_backward", "huber_loss_backward"])
def _smooth_l1_backward(call: OpCall) -> CostRecord:
    """sub, abs, compare, div or sign, select, * g = 6n."""
    return cost(call, 6 * numel(call.arg("self")))


@builtin("binary_cross_entropy")
def _bce(call: OpCall) -> CostRecord:
    """-(t*log(x) + (1-t)*log(1-x)): 2 logs, 2 subs, 2 muls, add, neg = 8n (+n weight)."""
    n = numel(call.args[0])
    per = 8 + (1 if call.arg("weight") is not None else 0)
    return cost(call, per * n + _reduced(call, n))


@builtin("binary_cross_entropy_backward")
def _bce_backward(call: OpCall) -> CostRecord:
    """g * (x - t) / (x * (1 - x)): sub, sub, mul, div, mul = 5n (+n weight)."""
    per = 5 + (1 if call.arg("weight") is not None else 0)
    return cost(call, per * numel(call.arg("self")))


@builtin("binary_cross_entropy_with_logits")
def _bce_logits(call: OpCall) -> CostRecord:
    """(1-t)*x + log1p(exp(-|x|)) + max(-x, 0): 7n (+n weight, +2n pos_weight)."""
    n = numel(call.args[0])
    per = 7 + (1 if call.arg("weight") is not None else 0) + (2 if call.arg("pos_weight") is not None else 0)
    return cost(call, per * n + _reduced(call, n))
