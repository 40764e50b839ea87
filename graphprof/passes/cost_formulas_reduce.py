"""Cost formulas of reductions, scans and sorts, pooling, upsampling and
embedding lookups.

A reduction of ``n`` input elements into ``m`` outputs does ``n - m`` adds
(or comparisons): each output starts from its first element. Composite
reductions (mean, variance, norms) add the per-element work of their
expression. Pooling counts one operation per window element per output.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from graphprof.passes.cost_formulas import (
    OpCall, builtin, cost, footprint_bytes, itemsize, numel, read_bytes, tensors_in,
)
from graphprof.passes.records import CostRecord


def _n_m(call: OpCall) -> tuple[int, int]:
    return numel(call.args[0]), call.out_numel


@builtin(["sum", "nansum", "prod", "any", "all", "amax", "amin", "argmax", "argmin", "count_nonzero",
          "aminmax", "prims::sum", "prims::prod", "prims::amax", "prims::amin", "prims::xor_sum"])
def _reduce(call: OpCall) -> CostRecord:
    """n - m adds, multiplies or comparisons."""
    n, m = _n_m(call)
    return cost(call, max(n - m, 0))


@builtin(["max", "min"])
def _max_min(call: OpCall) -> CostRecord:
    """max(x) / max(x, dim) reduce (n - m comparisons); max(x, y) is elementwise (1 per element)."""
    if len(call.args) > 1 and isinstance(call.args[1], torch.Tensor):
        return cost(call, call.out_numel)
    n, m = _n_m(call)
    return cost(call, max(n - m, 0))


@builtin(["mean", "nanmean"])
def _mean(call: OpCall) -> CostRecord:
    """n - m adds and m divides: n."""
    return cost(call, numel(call.args[0]))


@builtin("logsumexp")
def _logsumexp(call: OpCall) -> CostRecord:
    """max + log(sum(exp(x - max))): max, sub, exp, add per element (4n), log and add per output (2m)."""
    n, m = _n_m(call)
    return cost(call, 4 * n + 2 * m)


@builtin(["linalg_vector_norm", "norm"])
def _norm(call: OpCall) -> CostRecord:
    """(sum |x|^p)^(1/p): abs-power and add per element (2n), a root per output (m)."""
    n, m = _n_m(call)
    return cost(call, 2 * n + m)


@builtin(["var", "var_mean", "std", "std_mean", "prims::var"])
def _var(call: OpCall) -> CostRecord:
    """mean (n), then sub, square, add (3n) and a divide per output (m); std adds a sqrt (m)."""
    n, m = _n_m(call)
    extra = m if "std" in call.target.overloadpacket.__name__ else 0
    return cost(call, 4 * n + m + extra)


@builtin(["cumsum", "cumprod", "cummax", "cummin", "_cummax_helper", "_cummin_helper"])
def _scan(call: OpCall) -> CostRecord:
    """One add (multiply, comparison) per element."""
    return cost(call, numel(call.args[0]))


@builtin("logcumsumexp")
def _logcumsumexp(call: OpCall) -> CostRecord:
    """Running log-add-exp: max, sub, exp, log1p, add = 5 per element."""
    return cost(call, 5 * numel(call.args[0]))


def _dim_size(t: torch.Tensor, dim: Any) -> int:
    if t.dim() == 0:
        return 1
    return int(t.shape[int(dim if dim is not None else -1)])


@builtin(["sort", "argsort", "msort"])
def _sort(call: OpCall) -> CostRecord:
    """Comparison sort: n * ceil(log2(s)) comparisons, s the length of the sorted dimension."""
    x = call.args[0]
    s = _dim_size(x, call.arg("dim", -1))
    return cost(call, numel(x) * max(math.ceil(math.log2(s)), 1) if s > 1 else 0)


@builtin("topk")
def _topk(call: OpCall) -> CostRecord:
    """Heap selection: n * ceil(log2(k + 1)) comparisons."""
    k = int(call.arg("k"))
    return cost(call, numel(call.args[0]) * max(math.ceil(math.log2(k + 1)), 1))


@builtin(["kthvalue", "median", "nanmedian", "mode"])
def _select(call: OpCall) -> CostRecord:
    """Linear-time selection: about n comparisons."""
    return cost(call, numel(call.args[0]))


@builtin(["_foreach_norm", "_foreach_max"])
def _foreach_reduce(call: OpCall) -> CostRecord:
    """Per tensor as linalg_vector_norm (2n + 1) or amax (n - 1)."""
    norm = "norm" in call.target.overloadpacket.__name__
    sizes = [numel(t) for t in tensors_in(call.args[0])]
    return cost(call, sum(2 * n + 1 if norm else max(n - 1, 0) for n in sizes))


# -- pooling ---------------------------------------------------------------------------
def _window(call: OpCall, spatial_dims: int) -> int:
    kernel = call.arg("kernel_size")
    kernel = [kernel] if isinstance(kernel, int) else list(kernel)
    if len(kernel) == 1:
        kernel = kernel * spatial_dims
    return int(math.prod(kernel))


def _spatial_dims(call: OpCall) -> int:
    name = call.target.overloadpacket.__name__
    return 3 if "3d" in name else 1 if "1d" in name else 2


@builtin(["max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
          "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d"])
def _pool(call: OpCall) -> CostRecord:
    """One comparison (max) or add/divide (average) per window element per output."""
    return cost(call, call.out_numel * _window(call, _spatial_dims(call)))


@builtin(["max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward"])
def _max_pool_backward(call: OpCall) -> CostRecord:
    """grad_input[index] += g: one add per gradient element; reads g and the indices, not the input."""
    return cost(call, numel(call.args[0]), bytes_read=read_bytes([call.args[0], call.arg("indices")]))


@builtin(["avg_pool2d_backward", "avg_pool3d_backward"])
def _avg_pool_backward(call: OpCall) -> CostRecord:
    """g / count added to every window element: (window + 1) per gradient element."""
    g = call.args[0]
    return cost(call, numel(g) * (_window(call, _spatial_dims(call)) + 1), bytes_read=read_bytes([g]))


@builtin(["_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d", "adaptive_max_pool2d",
          "adaptive_max_pool3d", "adaptive_max_pool1d"])
def _adaptive_pool(call: OpCall) -> CostRecord:
    """Every input element is added (compared) once, plus a divide per output: about n."""
    return cost(call, numel(call.args[0]))


@builtin(["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"])
def _adaptive_avg_pool_backward(call: OpCall) -> CostRecord:
    """Every input element receives g / count: one divide per input element; reads g only."""
    return cost(call, call.out_numel, bytes_read=read_bytes([call.args[0]]))


@builtin(["adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"])
def _adaptive_max_pool_backward(call: OpCall) -> CostRecord:
    return cost(call, numel(call.args[0]), bytes_read=read_bytes([call.args[0], call.arg("indices")]))


#: FLOPs per output element of interpolation: taps multiplied and summed.
_UPSAMPLE = {"nearest": 0, "linear": 3, "bilinear": 7, "bicubic": 31, "trilinear": 15}


def _upsample_kind(name: str) -> str:
    core = name.removeprefix("_").removeprefix("upsample_").split("_")[0]
    return "nearest" if core.startswith("nearest") else core[:-2]


@builtin(["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
          "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
          "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"])
def _upsample(call: OpCall) -> CostRecord:
    kind = _upsample_kind(call.target.overloadpacket.__name__)
    return cost(call, _UPSAMPLE.get(kind, 1) * call.out_numel)


@builtin(["upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward",
          "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward",
          "_upsample_nearest_exact3d_backward", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
          "upsample_bicubic2d_backward", "upsample_trilinear3d_backward"])
def _upsample_backward(call: OpCall) -> CostRecord:
    """Each gradient element is scattered to its taps: (1 + FLOPs per output element) per gradient element."""
    kind = _upsample_kind(call.target.overloadpacket.__name__.removesuffix("_backward"))
    return cost(call, (_UPSAMPLE.get(kind, 1) + 1) * numel(call.args[0]))


# -- embedding ---------------------------------------------------------------------------
@builtin("embedding")
def _embedding(call: OpCall) -> CostRecord:
    """A gather: reads the indices and the rows it picks, not the whole table."""
    weight, indices = call.args[0], call.args[1]
    picked = min(call.out_numel * itemsize(weight), footprint_bytes(weight))
    return cost(call, 0, bytes_read=read_bytes([indices]) + picked)


@builtin("embedding_dense_backward")
def _embedding_backward(call: OpCall) -> CostRecord:
    """grad_weight[i] += g row by row: one add per gradient element (and with
    scale_grad_by_freq, a count per index and a divide per gradient element)."""
    g, indices = call.args[0], call.args[1]
    flops = numel(g) * (2 if call.arg("scale_grad_by_freq") else 1)
    return cost(call, flops, bytes_read=read_bytes([g, indices]))


@builtin(["_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"])
def _embedding_bag(call: OpCall) -> CostRecord:
    """Gathers one row per index and sums (or averages) them into bags: one add per gathered element."""
    weight, indices = call.args[0], call.args[1]
    row = numel(weight) // max(int(weight.shape[0]), 1)
    gathered = numel(indices) * row
    others = [t for t in call.inputs if t is not weight]
    return cost(call, gathered, bytes_read=read_bytes(others) + gathered * itemsize(weight))


@builtin(["_embedding_bag_backward", "_embedding_bag_dense_backward"])
def _embedding_bag_backward(call: OpCall) -> CostRecord:
    g = call.args[0]
    indices = call.arg("indices")
    row = int(g.shape[-1]) if g.dim() else 1
    return cost(call, numel(indices) * row if isinstance(indices, torch.Tensor) else numel(g))

