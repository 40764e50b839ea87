"""The cost pass: a ``CostRecord`` (FLOPs, bytes read, bytes written) on every op node.

Reads ``ANNOTATION`` (for the op's name in messages) and the ``val``
metadata make_fx leaves on nodes (FakeTensors: shapes, dtypes, strides), and
writes ``COST``. The formulas live in a registry keyed by aten op
(``cost_formulas`` and its companion modules); see ``cost_formulas`` for
the conventions. An op with no formula gets ``flops=None`` and bytes by the
default rule (inputs read, outputs written), so it is never counted as 0.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.fx

# The companion modules register their formulas on import.
import graphprof.passes.cost_formulas_comm  # noqa: F401
import graphprof.passes.cost_formulas_data  # noqa: F401
import graphprof.passes.cost_formulas_nn  # noqa: F401
import graphprof.passes.cost_formulas_pointwise  # noqa: F401
import graphprof.passes.cost_formulas_reduce  # noqa: F401
import graphprof.passes.cost_formulas_rnn  # noqa: F401
from graphprof.passes.annotate import is_op_node
from graphprof.passes.cost_formulas import (
    OpCall, cost as _cost_of, default_bytes, lookup, register_cost, tensors_in, unregister_cost,
)
from graphprof.passes.records import ANNOTATION, COST, CostRecord

__all__ = ["cost", "op_call", "has_formula", "register_cost", "unregister_cost"]

log = logging.getLogger("graphprof")


def _value(node: torch.fx.Node, gm: torch.fx.GraphModule) -> Any:
    """A node's value: the constant of a get_attr, else the recorded FakeTensor (or None)."""
    if node.op == "get_attr":
        return functools.reduce(getattr, str(node.target).split("."), gm)
    return node.meta.get("val")


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


def has_formula(target: Any) -> bool:
    """True when ``target`` has a cost formula (views and ``getitem`` are deliberately free)."""
    return lookup(target) is not None


@functools.lru_cache(maxsize=None)
def _warn_once(op: str, error: str) -> None:
    log.warning("graphprof: the cost formula of %s failed (%s); its FLOPs are left unknown", op, error)


def _as_record(result: Any, call: OpCall) -> CostRecord:
    if isinstance(result, CostRecord):
        return result
    if isinstance(result, int) and not isinstance(result, bool):
        return _cost_of(call, result)
    if result is None:
        return default_bytes(call)
    raise TypeError(f"a cost formula must return a CostRecord, an int or None, not {type(result).__name__}")


def node_cost(node: torch.fx.Node, gm: torch.fx.GraphModule) -> CostRecord:
    """The cost of one op node (flops None when it has no formula or its formula fails)."""
    formula = lookup(node.target)
    try:
        call = op_call(node, gm)
    except Exception as exc:  # an unexpected node must not stop profiling
        _warn_once(_op_name(node), f"{type(exc).__name__}: {exc}")
        return CostRecord(flops=None, bytes_read=0, bytes_written=0)
    if formula is None:
        return default_bytes(call)
    try:
        return _as_record(formula(call), call)
    except Exception as exc:  # a formula bug must not stop profiling
        _warn_once(_op_name(node), f"{type(exc).__name__}: {exc}")
        return default_bytes(call)


def _op_name(node: torch.fx.Node) -> str:
    ann = node.meta.get(ANNOTATION)
    return ann.op if ann is not None else str(node.target)


def cost(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Write a CostRecord on every op node of ``gm``; returns ``gm``."""
    for node in gm.graph.nodes:
        if is_op_node(node):
            node.meta[COST] = node_cost(node, gm)
    return gm
