"""What a cost formula sees of an fx node: argument values, distinct inputs, written tensors.

Its own module, below ``cost`` (which runs the formulas) and beside the
formula modules, because collective formulas (``cost_formulas_comm``) also
build an ``OpCall`` from a node for the facts a profile keeps about it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

from graphprof.passes.cost_formulas import OpCall, sparse_stand_in, tensors_in
from graphprof.passes.records import SPARSE_VALUE


#: Ops whose output is their sparse matrix input transposed (the backward of ``sparse @ dense``).
_TRANSPOSES = (torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.numpy_T.default)


def note_sparse(node: torch.fx.Node, value: Any) -> None:
    """Keep on ``node`` a stand-in of ``value`` when it is a sparse matrix, for the formulas (its ``val``
    is None: make_fx records none for sparse tensors, and a fake one would have no stored elements)."""
    stand_in = sparse_stand_in(value) if isinstance(value, torch.Tensor) else None
    if stand_in is not None and node.meta.get("val") is None:
        node.meta[SPARSE_VALUE] = stand_in


def _value(node: torch.fx.Node, gm: torch.fx.GraphModule) -> Any:
    """A node's value: the constant of a get_attr, else the recorded FakeTensor, else the stand-in of a
    sparse matrix or of its transpose (or None)."""
    if node.op == "get_attr":
        return functools.reduce(getattr, str(node.target).split("."), gm)
    value = node.meta.get("val")
    if value is not None:
        return value
    if node.target in _TRANSPOSES and isinstance(node.args[0], torch.fx.Node):
        source = _value(node.args[0], gm)
        return sparse_stand_in(source, transposed=True) if isinstance(source, torch.Tensor) else None
    return node.meta.get(SPARSE_VALUE)


def _mutated_args(target: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors an op writes through its arguments without returning them
    (``_foreach_add_``, batch norm's running statistics)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    returned = {s for r in schema.returns if r.alias_info is not None for s in r.alias_info.before_set}
    written: list[torch.Tensor] = []
    for i, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not info.is_write or set(info.before_set) & returned:
            continue
        value = kwargs.get(argument.name, args[i] if i < len(args) and not argument.kwarg_only else None)
        written.extend(tensors_in(value))
    return written


def op_call(node: torch.fx.Node, gm: torch.fx.GraphModule) -> OpCall:
    """What a formula sees of ``node``: argument values, distinct inputs, written tensors."""
    env = functools.partial(_value, gm=gm)
    args = tuple(torch.fx.node.map_arg(node.args, env))
    kwargs = dict(torch.fx.node.map_arg(node.kwargs, env))
    inputs: list[torch.Tensor] = []
    seen: set[int] = set()
    for producer in node.all_input_nodes:
        for t in tensors_in(env(producer)):
            if id(t) not in seen:
                seen.add(id(t))
                inputs.append(t)
    out = node.meta.get("val")
    written = tensors_in(out) + _mutated_args(node.target, args, kwargs)
    return OpCall(target=node.target, args=args, kwargs=kwargs, out=out, inputs=tuple(inputs), written=tuple(written))
