"""Tensors whose sizes depend on data, and Python reads of those sizes during a capture.

Most sizes in a step follow from its inputs' shapes, which are part of the
call's signature. A few ops size their output by the values they read:
``nonzero``, a boolean mask (``logits[labels != -100]``), ``masked_select``,
``unique``, ``repeat_interleave`` with tensor repeats, ``bincount``. The
graph itself replays them faithfully: each op sizes its output again on the
new data. But a size Python reads during the capture call (``n =
idx.shape[0]``, ``len(idx)``, ``x.view(x.size(0), -1)``) is a number the
graph then holds as a constant: a replay would return, divide by or branch
on the capture call's count.

The trace itself does the same where torch computes a size in C++ and
records it: ``flatten`` becomes ``view(x, [15])``, and the backward of
``loss[mask].mean()`` expands the gradient to ``[5]``. Replayed on a batch
that keeps 6 items, such a graph fails part way through the step.

Some backward formulas hold the count as a number instead: the mean of
``binary_cross_entropy_with_logits`` divides its gradient by it, ``var``
and ``std`` multiply theirs by ``2 / (count - correction)``. Nothing in
the graph's sizes shows it, and a replay keeping another number of items
scaled every gradient by the capture call's count over its own, silently
(ELECTRA's pretraining loss over the unpadded tokens). Such ops
(``COUNTING_BACKWARDS``), and any op given a number equal to a data-sized
tensor's element count, are taken as sizes traced in.

So outputs of those ops, and tensors computed from them, are marked while
the capture runs, and a Python read of a marked tensor's size is handled as
a read of its value (capture/value_guards.py); and after the trace,
``guard_baked_sizes`` looks for ops computing on such tensors with sizes
that are no other tensor's shape. Either way the data-sized outputs' sizes
are kept as guards when they can be computed from the call's inputs before
a replay (another count captures another path); otherwise the capture is
refused, with the reason. A boolean mask's count is computed from the mask
alone (``_mask_count_prefix``): the tensor it indexes usually comes from
the model, which no check can run before the replay. A graph in which the sizes only flow from op to
op (``F.cross_entropy(logits[keep], labels[keep])``) needs neither.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import weakref
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from graphprof.capture.scalars import DataDependentError, Guard
from graphprof.capture.value_guards import ValueGuards, sizes
from graphprof.passes.records import CAPTURE

aten = torch.ops.aten

#: Ops whose output sizes depend on the values they read.
DATA_SIZED_OPS = frozenset({
    aten.nonzero.default, aten.masked_select.default, aten._unique.default, aten._unique2.default,
    aten.unique_dim.default, aten.unique_consecutive.default, aten.unique_dim_consecutive.default,
    aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor, aten.bincount.default,
})
_MASK_DTYPES = (torch.bool, torch.uint8)
#: Ops whose backward formula holds the element count of their input as a number, not as a size
#: argument: ``binary_cross_entropy_with_logits`` divides the gradient by it for its mean, ``var`` and
#: ``std`` multiply it by ``2 / (count - correction)``. On a data-sized input the count is the
#: capture call's, and a replay keeping another number of items would scale its gradients wrongly.
COUNTING_BACKWARDS = frozenset({aten.binary_cross_entropy_with_logits, aten.var, aten.std, aten.var_mean,
                                aten.std_mean})

#: Torch functions that read a tensor's sizes into Python.
SIZE_READS = frozenset({torch.Tensor.size, torch.Tensor.shape.__get__, torch.Tensor.numel,  # type: ignore[attr-defined]
                        torch.Tensor.nelement, torch.Tensor.__len__, torch.numel})
#: Callers whose size reads are the tracing machinery's own bookkeeping, not the step's.
_MACHINERY = (*(f"{torch.__path__[0]}/{part}" for part in ("fx/", "_subclasses/", "utils/_python_dispatch",
                                                            "_dynamo/", "_prims_common/")),
              __file__.rsplit("/", 2)[0] + "/")  # graphprof itself


def _data_sized(func: Any, args: tuple) -> bool:
    if func in DATA_SIZED_OPS:
        return True
    if func is aten.index.Tensor and len(args) > 1:  # a boolean mask index: nonzero inside
        return any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in args[1] or ())
    return False


class DataSizedTensors:
    """The tensors of one capture whose sizes depend on data (by id, with a weak reference)."""

    def __init__(self) -> None:
        self._marked: dict[int, weakref.ref] = {}

    def __contains__(self, tensor: Any) -> bool:
        ref = self._marked.get(id(tensor))
        return ref is not None and ref() is tensor

    def note_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Mark ``out``'s tensors if ``func`` sizes them by data, or computes them from a marked tensor.

        A tensor shaped like one of the op's unmarked inputs (the gradient a
        boolean index scatters back into its input's shape) and a 0-d result
        are left unmarked: their sizes follow from the signature.
        """
        if not self._marked and func not in DATA_SIZED_OPS and func is not aten.index.Tensor:
            return
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not _data_sized(func, args) and not any(t in self for t in inputs):
            return
        static = {tuple(t.shape) for t in inputs if t not in self}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dim() > 0 and tuple(t.shape) not in static:
                self._marked[id(t)] = weakref.ref(t)

    def read_by_step(self, func: Any, args: tuple) -> bool:
        """Whether this torch-function call is the step reading a marked tensor's sizes."""
        if func not in SIZE_READS or not args or args[0] not in self:
            return False
        caller = sys._getframe(2).f_code.co_filename  # 0: here, 1: the torch-function mode, 2: who asked
        return not caller.startswith(_MACHINERY)


def guard_baked_sizes(graph: torch.fx.Graph, value_guards: ValueGuards, guards: list[Guard]) -> None:
    """Guard the sizes of every data-sized op's output if a later op was traced with a size derived
    from them; DataDependentError when they cannot be computed before a replay."""
    if not any(node.op == "call_function" and _data_sized_node(node) for node in graph.nodes):
        return
    baked = _first_baked_size(graph)
    if baked is None:
        return
    for node in graph.nodes:
        if node.op != "call_function" or not _data_sized_node(node):
            continue
        where = getattr(node.meta.get(CAPTURE), "source", "") or node.name
        prefix, why_not = _mask_count_prefix(node, value_guards)
        if prefix is not None:  # ``logits[keep]``: the count is the mask's alone, whatever it indexes
            kept = tuple(node.meta["val"].shape)[len(node.args[1]) - 1]  # the mask's dimension of the output
            guards.append(Guard(prefix, prefix.placeholders, kept, where))
            continue
        prefix, why_not = value_guards.prefix(node, sizes, "the size of a tensor sized by its data")
        if prefix is None:
            raise DataDependentError(
                f"{node.target} at {where} sizes its output by its data and {baked.target} was traced with "
                f"a size computed from it; a check of those sizes {why_not}, so a static graph cannot "
                "make it before it runs")
        guards.append(Guard(prefix, prefix.placeholders, sizes(node.meta["val"]), where))


def _mask_count(mask: torch.Tensor) -> int:
    """How many items a boolean (or uint8) mask keeps: what sizes the tensor it indexes."""
    return int(torch.count_nonzero(mask))


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _mask_count_prefix(node: torch.fx.Node, value_guards: ValueGuards) -> tuple[Any, str]:
    """For ``x[mask]`` (one boolean mask, the last index), the prefix computing the mask's count.

    Why: the output's size is the count times ``x``'s other dimensions, which
    the signature fixes when ``x`` is not itself sized by data. The mask is
    usually made from the call's inputs (``labels != -100``, an attention
    mask) or from constants (a contrastive loss's ``~eye``) while ``x`` comes
    from the model, so a prefix of the whole index would run the model, and
    the capture was refused for it.
    """
    if node.target is not aten.index.Tensor or len(node.args) < 2 or not isinstance(node.args[1], (list, tuple)):
        return None, ""
    indices = [i for i in node.args[1] if i is not None]
    mask = node.args[1][-1] if node.args[1] else None
    if len(indices) != 1 or not isinstance(mask, torch.fx.Node) or mask is not indices[0]:
        return None, ""
    val, source = _value(mask), _value(node.args[0])
    if not isinstance(val, torch.Tensor) or val.dtype not in _MASK_DTYPES or not isinstance(source, torch.Tensor):
        return None, ""
    if isinstance(node.args[0], torch.fx.Node) and _derives_from_data_sized(node.args[0]):
        return None, ""
    return value_guards.prefix(mask, _mask_count, "the count of a mask that sizes a tensor")


def _derives_from_data_sized(node: torch.fx.Node) -> bool:
    """Whether a data-sized op is among ``node``'s ancestors (then its own size is not the signature's)."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and _data_sized_node(n):
            return True
        todo.extend(n.all_input_nodes)
    return False


def _data_sized_node(node: torch.fx.Node) -> bool:
    args = tuple(a.meta.get("val") if isinstance(a, torch.fx.Node) else
                 [i.meta.get("val") if isinstance(i, torch.fx.Node) else i for i in a] if isinstance(a, list) else a
                 for a in node.args)
    return _data_sized(node.target, args)


def _first_baked_size(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """The first op traced with a size taken from a data-sized tensor, or None.

    A size argument is taken from one when it is the shape of a tensor sized
    by data, or of one computed from it (``expand(g, [5, 3])``), or has its
    number of elements (``flatten``'s ``view(x, [15])``). ``-1`` entries are
    sized again at run time (``view(x, [-1, 3])``). A size that only
    coincides with a data-sized shape is taken for one: the guard it adds
    costs captures, never a wrong result.
    """
    derived: set[torch.fx.Node] = set()
    static: set[tuple[int, ...]] = set()
    shapes: set[tuple[int, ...]] = set()
    numels: set[int] = set()
    for node in graph.nodes:
        val = node.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        for size in _size_arguments(node):
            if tuple(size) in shapes or (min(size, default=0) >= 0 and math.prod(size) in numels):
                return node
        if derived.intersection(node.all_input_nodes) and (
                getattr(node.target, "overloadpacket", None) in COUNTING_BACKWARDS
                or any(_is_count(a, numels) for a in node.args)):
            return node
        dd = node.op == "call_function" and _data_sized_node(node)
        if dd or (shape and shape not in static and any(n in derived for n in node.all_input_nodes)):
            derived.add(node)
            if shape is not None:
                shapes.add(shape)
                numels.add(math.prod(shape))
        elif shape is not None:
            static.add(shape)
    return None


def _is_count(argument: Any, numels: set[int]) -> bool:
    """A number argument equal to a data-sized tensor's element count (``div_(grad, 7)``)."""
    return type(argument) in (int, float) and argument in numels


def _size_arguments(node: torch.fx.Node) -> list[list[int]]:
    """The ``SymInt[]`` arguments of an aten op node (sizes, not dims)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    names = _size_names(str(schema))
    found = []
    for i, argument in enumerate(schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
        if argument.name in names and isinstance(value, (list, tuple)):
            found.append(list(value))
    return found


@functools.lru_cache(maxsize=None)
def _size_names(schema: str) -> frozenset[str]:
    """Names of an op's ``SymInt[]`` arguments, read from its schema's text (the argument objects'
    types say ``List[int]`` for sizes and dims alike)."""
    return frozenset(re.findall(r"SymInt\[\d*\]\??\s+(\w+)", schema))
