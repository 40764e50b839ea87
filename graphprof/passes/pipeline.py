"""The passes every captured graph goes through, whole-step or segment, in order."""

from __future__ import annotations

import torch.fx

from graphprof.passes.annotate import annotate
from graphprof.passes.cost import cost
from graphprof.passes.memory import memory
from graphprof.passes.op_attrs import op_attrs


def prepare_graph(gm: torch.fx.GraphModule) -> None:
    """Annotate, cost, model memory and record op attributes: one pipeline for every capture."""
    annotate(gm)
    cost(gm)
    memory(gm)
    op_attrs(gm)
