"""What a tensor the step hands out carries besides its value and its autograd record.

Eager's tensor is the object the step's code made, so what the step did to it
is still there after the call: ``h.retain_grad()`` makes it keep a ``.grad``,
the gradient the step's backward gave it, with ``retains_grad`` True, so that a
later backward through it adds to that ``.grad`` before it raises eager's
"backward through the graph a second time" (saliency and adversarial-embedding
code reads ``embeds.grad`` after the step; ``loss.retain_grad(); return loss``).
A replay's tensor is a new object the graph made, without it: the caller read
``None``, with torch's non-leaf ``.grad`` warning.

``HandedTensors.note`` is told of every tensor a replay hands out, returned
or kept (``BackwardNodes.history_of``, which names the record a replay gives
it, is asked about each one). For one that retains its gradient it puts a
host node into the graph, after the ops that make that gradient, that gives
the replay's tensor (the one ``with_history`` hands out) what eager's had: it
retains its gradient, and its ``.grad`` is the graph's value of eager's (the
clone ``retain_grad``'s hook makes is a backward op like the others), or None
where eager's was (``retain_grad()`` called after the backward). A ``.grad``
the step set to a tensor from before the call refuses the capture.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from graphprof.capture.host_nodes import effect_node
from graphprof.capture.kept_history import with_history
from graphprof.capture.scalars import DataDependentError


class HandedTensors:
    """The tensors the capture call hands out that retain their gradient, each given it again by a host
    node of the graph (``graph``, ``node_of``, ``made_here``: the recorder's; ``record``: the record
    of a node at the graph's end)."""

    def __init__(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                 made_here: Callable[[torch.Tensor], bool], record: Callable[[], Any]) -> None:
        self._graph, self._node_of, self._made_here, self._record = graph, node_of, made_here, record
        #: id -> the tensors already noted (held, so that the ids stay theirs while the capture runs).
        self._noted: dict[int, torch.Tensor] = {}

    def note(self, tensor: torch.Tensor, history: str | None, where: str) -> None:
        """Give ``tensor`` (``where`` holds it; ``history``: the name of the record a replay gives it) on
        every replay what it carries now; refuses what a replay could not give as eager's."""
        if id(tensor) in self._noted or not self._made_here(tensor) or history is None:
            return
        self._noted[id(tensor)] = tensor
        if not tensor.retains_grad:
            return
        slots = [self._node_of(tensor)]
        grad = tensor.grad
        if grad is not None:
            if not self._made_here(grad):
                raise DataDependentError(f"{where} holds a tensor whose .grad the step set to a tensor from "
                                         "before the call, which a replayed graph would not hand out")
            slots.append(self._node_of(grad))

        def give(values: tuple) -> None:
            handed = with_history(values[0], history)
            handed.retain_grad()
            if len(values) == 2:
                handed.grad = values[1]

        effect_node(self._graph, "give the step's tensor its .grad", give, slots, self._record())
