"""Helpers for the cost-pass tests: capture a step, read the cost of its op nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import graphprof
from graphprof.passes.annotate import annotate, is_op_node
from graphprof.passes.cost import cost
from graphprof.passes.records import ANNOTATION, COST, CostRecord, OpAnnotation

MATMUL_TYPES = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot"})


@dataclass(frozen=True)
class CostedNode:
    node: torch.fx.Node
    ann: OpAnnotation
    cost: CostRecord


def costed(gm: torch.fx.GraphModule) -> list[CostedNode]:
    return [CostedNode(n, n.meta[ANNOTATION], n.meta[COST]) for n in gm.graph.nodes if is_op_node(n)]


def capture_step(step: Callable[..., Any], *inputs: Any) -> torch.fx.GraphModule:
    """Trace ``step`` (call 1 eager, call 2 captures) and return its annotated, costed graph."""
    fn = graphprof.trace(step)
    fn(*inputs)
    fn(*inputs)
    return fn.graph_module


def capture_demo(demo: Any) -> torch.fx.GraphModule:
    fn = graphprof.trace(demo.step_fn)
    for i in range(2):
        fn(*demo.make_inputs(i))
    return fn.graph_module


def costs_of(f: Callable[..., Any], *args: Any) -> list[CostedNode]:
    """make_fx ``f`` (no training step needed) and run the annotate and cost passes."""
    gm = make_fx(f)(*args)
    annotate(gm)
    cost(gm)
    return costed(gm)


def only(nodes: Iterable[CostedNode], op_type: str) -> CostedNode:
    matches = [c for c in nodes if c.ann.type == op_type]
    assert len(matches) == 1, f"{len(matches)} {op_type} nodes"
    return matches[0]


def total_flops(nodes: Iterable[CostedNode]) -> int:
    return sum(c.cost.flops for c in nodes)
