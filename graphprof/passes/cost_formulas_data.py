"""Cost formulas of data movement: metadata ops, copies and casts, factories,
concatenation and padding, indexing, gathers and scatters, and ``.item()``.

These move bytes and do no arithmetic (0 FLOPs), except where noted (an
accumulating scatter adds, ``arange`` computes its values). Gathers read only
the elements they pick (the indices plus an output's worth of the source),
and in-place scatters write only the elements they touch: charging the whole
tensor would make an embedding or a sparse update look memory-bound.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from graphprof.passes.cost_formulas import (
    OpCall, builtin, cost, footprint_bytes, free_formula, is_one, itemsize, numel, read_bytes,
)
from graphprof.passes.records import CostRecord

#: Metadata ops and allocations that the schema does not flag as views: no
#: arithmetic, and no element is read or written.
FREE = (
    "_unsafe_view", "lift_fresh", "_reshape_alias", "detach_", "t_", "transpose_", "squeeze_",
    "unsqueeze_", "as_strided_", "resize_", "set_", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "_assert_tensor_metadata", "record_stream", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "empty_permuted", "_assert_async", "unsafe_split",
    "unsafe_split_with_sizes", "unsafe_chunk",
)
builtin(FREE)(free_formula())

#: Copies: read the inputs, write the outputs, no arithmetic.
COPIES = (
    "clone", "_to_copy", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy", "contiguous",
    "alias_copy", "view_copy", "t_copy", "transpose_copy", "permute_copy", "expand_copy",
    "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "detach_copy", "_reshape_copy",
    "unbind_copy", "split_copy", "split_with_sizes_copy", "as_strided_copy", "diagonal_copy",
    "unfold_copy", "cat", "stack", "constant_pad_nd",
    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "repeat", "flip", "roll", "slice_scatter",
    "select_scatter", "diagonal_scatter", "as_strided_scatter", "index_copy", "masked_scatter",
    "_pin_memory", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "im2col", "col2im",
    "to_dense", "masked_select", "repeat_interleave", "_to_dense", "narrow_copy", "select_backward",
    "slice_backward", "diagonal_backward", "prims::convert_element_type", "prims::device_put",
    "prims::copy_strided", "prims::clone",
)


@builtin(COPIES)
def _copy(call: OpCall) -> CostRecord:
    return cost(call, 0)


#: Factories: write their output and read nothing (shape-only inputs are not read).
FACTORIES = (
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
    "new_full", "scalar_tensor", "eye",
)


@builtin(FACTORIES)
def _factory(call: OpCall) -> CostRecord:
    return cost(call, 0, bytes_read=0)


@builtin(["arange", "linspace", "logspace", "prims::iota"])
def _ranges(call: OpCall) -> CostRecord:
    """arange: start + i*step, 2 per element; linspace likewise; logspace adds a pow (3)."""
    per = 3 if "logspace" in str(call.target) else 2
    return cost(call, per * call.out_numel, bytes_read=0)


@builtin("_local_scalar_dense")
def _item(call: OpCall) -> CostRecord:
    """``.item()``: reads one element to the host; no tensor is written."""
    return cost(call, 0, bytes_written=0)


# -- gathers -------------------------------------------------------------------------
def _index_tensors(call: OpCall, source: torch.Tensor | None) -> list[torch.Tensor]:
    return [t for t in call.inputs if t is not source]


def gathered_read(call: OpCall, source: torch.Tensor, index_tensors: list[torch.Tensor]) -> int:
    """Bytes of the index tensors plus one output's worth of ``source`` elements."""
    picked = min(call.out_numel * itemsize(source), footprint_bytes(source))
    return read_bytes(index_tensors) + picked


@builtin(["index", "_unsafe_index", "index_select", "gather", "take", "take_along_dim"])
def _gather(call: OpCall) -> CostRecord:
    source = call.args[0]
    return cost(call, 0, bytes_read=gathered_read(call, source, _index_tensors(call, source)))


@builtin(["index_select_backward", "unfold_backward"])
def _accumulate_back(call: OpCall) -> CostRecord:
    """The gradient is added into a zeroed tensor of the input's shape: one add per gradient element."""
    return cost(call, numel(call.args[0]))


@builtin("nonzero")
def _nonzero(call: OpCall) -> CostRecord:
    """One comparison with zero per element read."""
    return cost(call, numel(call.args[0]))


# -- scatters --------------------------------------------------------------------------
def _touched_by_indices(self_t: torch.Tensor, indices: list[torch.Tensor | None]) -> int:
    """Elements of ``self`` addressed by advanced indexing ``self[indices]``.

    A boolean mask counts as if all its elements were true (an upper bound:
    how many are true is only known at run time).
    """
    shapes: list[tuple[int, ...]] = []
    dim, untouched = 0, 1
    for t in indices:
        if t is None:
            untouched *= int(self_t.shape[dim])
            dim += 1
        elif t.dtype == torch.bool:
            shapes.append((numel(t),))
            dim += t.dim()
        else:
            shapes.append(tuple(int(d) for d in t.shape))
            dim += 1
    untouched *= math.prod(int(d) for d in self_t.shape[dim:])
    return int(math.prod(torch.broadcast_shapes(*shapes)) * untouched) if shapes else numel(self_t)


def _touched(call: OpCall, self_t: torch.Tensor) -> int:
    """Elements of ``self`` a scatter-like op updates."""
    indices = call.arg("indices")
    if isinstance(indices, (list, tuple)):
        return _touched_by_indices(self_t, list(indices))
    index = call.arg("index")
    if not isinstance(index, torch.Tensor):
        return numel(self_t)
    if call.target.overloadpacket.__name__.startswith("index_"):
        # index_add/copy/fill/reduce: each index entry selects a whole slice along dim
        dim = int(call.arg("dim", 0)) % max(self_t.dim(), 1)
        size = int(self_t.shape[dim]) if self_t.dim() else 1
        return numel(index) * (numel(self_t) // max(size, 1))
    return numel(index)


def _scatter(accumulates: bool) -> Callable[[OpCall], CostRecord]:
    """Scatter-like ops: ``self`` updated at positions given by an index.

    Functional form: reads ``self`` and the sources, writes a whole new tensor.
    In-place form: reads the index and sources (and, when accumulating, the
    touched elements of ``self``), writes only the touched elements. FLOPs:
    one add per touched element when accumulating (two when multiplying by
    an ``alpha`` other than 1).
    """
    def formula(call: OpCall) -> CostRecord:
        self_t = call.args[0]
        touched = _touched(call, self_t)
        accumulate = accumulates or bool(call.arg("accumulate", False)) or call.arg("reduce") is not None
        flops = touched * (1 if is_one(call.arg("alpha", 1)) else 2) if accumulate else 0
        if not call.target.overloadpacket.__name__.endswith("_"):
            return cost(call, flops)
        others = [t for t in call.inputs if t is not self_t]
        touched_bytes = touched * itemsize(self_t)
        return cost(call, flops, bytes_read=read_bytes(others) + (touched_bytes if accumulate else 0),
                    bytes_written=touched_bytes)

    return formula


builtin(["scatter", "scatter_", "index_fill", "index_fill_", "index_put", "index_put_", "_unsafe_index_put",
         "_index_put_impl_", "index_copy_", "masked_scatter_"])(_scatter(accumulates=False))
builtin(["scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "index_add", "index_add_",
         "index_reduce", "index_reduce_"])(_scatter(accumulates=True))
