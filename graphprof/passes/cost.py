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
    OpCall, cost as _cost_of, default_bytes, lookup, register_cost, unregister_cost,
)
from graphprof.passes.op_call import op_call
from graphprof.passes.records import ANNOTATION, COST, CostRecord

__all__ = ["cost", "op_call", "has_formula", "register_cost", "unregister_cost"]

log = logging.getLogger("graphprof")


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
