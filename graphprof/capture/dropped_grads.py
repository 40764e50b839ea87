"""Where the step dropped the gradients the call began with (``zero_grad()``, ``p.grad = None``).

A replay must drop them where eager did, and a replay that fails must know
whether eager had dropped them yet (runtime/failed_replays.py). Dropping a
gradient is no op, so no node records it: before every op the recorder asks
whether one of the call's entry gradients is gone, and after the op the drop
is placed before the op's first node. Apart from recorder.py because it is
one question with its own state, asked on every op.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from graphprof.passes.records import CaptureRecord

_GRAD = operator.attrgetter("grad")


@dataclass(frozen=True)
class GradDrop:
    """Gradients the call began with that the step dropped at one place (``CaptureRecorder.grads_dropped``)."""

    #: The first node of the op after the drop (op nodes are never removed by the passes after capture).
    before: str
    #: ``id`` of each parameter whose gradient was gone there.
    params: frozenset[int]
    #: The context of the op after the drop (the node that drops them gets it).
    record: CaptureRecord


class DroppedGrads:
    """The gradients the call began with and not yet seen dropped, and where the step dropped them,
    one ``GradDrop`` per place, in order."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        entry = [p for p in params if p.grad is not None]
        self.entry_grads = (entry, [p.grad for p in entry])
        self.drops: list[GradDrop] = []
        self.dropped_now: tuple[frozenset[int], CaptureRecord] | None = None  # seen, its op not yet recorded

    def note(self, context: Callable[[tuple], CaptureRecord]) -> None:
        """Before an op: whether a gradient not yet seen dropped is gone (C-level maps, one per op)."""
        params, grads = self.entry_grads
        if all(map(operator.is_, map(_GRAD, params), grads)):
            return
        kept = [(p, g) for p, g in zip(params, grads) if p.grad is g]
        gone = frozenset(id(p) for p, g in zip(params, grads) if p.grad is not g)
        if self.dropped_now is not None:  # the op before made no node: the same place
            gone |= self.dropped_now[0]
        self.dropped_now = (gone, context(()))
        self.entry_grads = ([p for p, _ in kept], [g for _, g in kept])

    def place(self, new_nodes: list[torch.fx.Node]) -> None:
        """After an op: the gradients seen dropped before it were dropped before its first node."""
        first = next((n for n in new_nodes if n.op == "call_function"), None)
        if first is not None and self.dropped_now is not None:
            gone, record = self.dropped_now
            self.drops.append(GradDrop(first.name, gone, record))
            self.dropped_now = None
