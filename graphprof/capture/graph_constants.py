"""Tensors make_fx holds as constants of a captured graph, rewritten to be read when a replay runs.

make_fx turns every tensor the step reads that is not one of the traced
function's inputs into a ``get_attr`` constant. For most (parameters,
buffers, optimizer state) that is right: the graph updates those very
tensors in place. Some are not the same object on every call, so each is
replaced by a node that reads it where it lives when the replay reaches it
(``replace_constants``), keeping the constant's records:

* a gradient that existed before the step (``zero_grad()`` drops it, the
  next backward makes a new one): read from its parameter;
* a tensor the step keeps in its own state (``self.ema``): read from where
  it is kept;
* the ``.grad`` an argument already had: read from that call's argument.

A tensor read from one of the step's lists or dicts cannot be: which item a
later call reads is not known, so such a graph is refused.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
from torch import nn

from graphprof.capture.dtensor import is_dtensor, local_shard
from graphprof.capture.host_nodes import host_function, reader_node
from graphprof.capture.scalars import DataDependentError
from graphprof.passes.op_call import note_sparse

#: Makes the node that reads a constant, inserted where its ``get_attr`` was (None leaves it as is).
_Reader = Callable[[torch.fx.Graph, torch.fx.Node, Any], "torch.fx.Node | None"]


def replace_constants(gm: torch.fx.GraphModule, make_reader: _Reader) -> None:
    """Replace each tensor constant ``make_reader`` gives a reader node for; the reader keeps the
    constant's records, and an attribute no node reads any more is dropped."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target, None)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_before(node):
            reader = make_reader(gm.graph, node, value)
        if reader is None:
            continue
        reader.meta.update({k: v for k, v in node.meta.items() if k not in reader.meta})
        note_sparse(reader, value)  # make_fx kept no value of a sparse one: its cost needs what it stores
        node.replace_all_uses_with(reader)
        gm.graph.erase_node(node)
        if all(n.target != node.target for n in gm.graph.nodes if n.op == "get_attr"):
            delattr(gm, node.target)


def read_constants_at_run_time(gm: torch.fx.GraphModule, reads: dict[int, Callable[[], Any]]) -> None:
    """Replace each constant tensor whose id is in ``reads`` by a reader node calling its function
    when the replay reaches it (a gradient, a tensor the step keeps in ``self.ema``)."""
    def make_reader(graph: torch.fx.Graph, node: torch.fx.Node, value: Any) -> torch.fx.Node | None:
        read = reads.get(id(value))
        return None if read is None else reader_node(graph, read, f"{node.target}", None, scalar=False)

    replace_constants(gm, make_reader)


def read_grads_at_run_time(gm: torch.fx.GraphModule, grad_owner: dict[int, nn.Parameter]) -> None:
    """A gradient that existed before the step is read from its parameter when the replay starts.

    make_fx holds it as a constant, but ``.grad`` is replaced whenever the
    user's loop clears it (``zero_grad()`` sets it to None, the next backward
    makes a new tensor): a graph that accumulates into the captured tensor
    would write into a stale one.
    """
    read_constants_at_run_time(gm, {key: _grad_of(param) for key, param in grad_owner.items()})


def _grad_of(param: nn.Parameter) -> Callable[[], Any]:
    """A DTensor parameter's gradient is read as its local shard; a plain one's as it is, with no
    per-step type check (this reader runs once per gradient per step)."""
    if is_dtensor(param):
        return lambda: local_shard(param.grad)
    return lambda: param.grad


def read_input_grads(gm: torch.fx.GraphModule, grads: dict[int, int], placeholders: dict[int, torch.fx.Node]) -> None:
    """Replace the constant ``.grad`` an argument had at capture (id -> its position in the leaves)
    by a node reading that call's argument's ``.grad``: a backward accumulates into the gradient of
    the tensor given, which another call gives anew."""
    def make_reader(graph: torch.fx.Graph, node: torch.fx.Node, value: Any) -> torch.fx.Node | None:
        position = grads.get(id(value))
        if position is None or position not in placeholders:
            return None
        return graph.call_function(host_function(_grad_of_argument, f"read argument {position}.grad"),
                                   (placeholders[position],))

    replace_constants(gm, make_reader)


def _grad_of_argument(tensor: torch.Tensor) -> Any:
    return tensor.grad


def refuse_contained_tensors(gm: torch.fx.GraphModule, contained: dict[int, str]) -> None:
    """Refuse a graph that holds, as a constant, a tensor kept in one of the step's lists or dicts.

    Which item a later call would read (``self.hist[-1]`` of a longer list, a
    key of a dict replaced since) is not known from the one the capture call
    read, so a replay could not read it again: the step is profiled another way.
    """
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            where = contained.get(id(getattr(gm, node.target, None)))
            if where is not None:
                raise DataDependentError(f"the step reads a tensor kept in {where}, which a replayed graph would "
                                         "hold as the capture call's constant")
