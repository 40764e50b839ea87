"""Gradients the step drops part way (``opt.zero_grad()`` after the forward), dropped where it drops them.

Why a module of its own: a parameter's old gradient that the graph no longer
reads is dropped by a replay, as ``zero_grad(set_to_none=True)`` drops it in
eager. Where eager drops it matters: before the step's first op a replay drops
it before the graph runs (``CapturedStep.start_clears``); after an op, a node
of the graph drops it there (``place_drops``), marked ``DROPS_GRADS`` so that a
failed replay can tell whether eager still held it (runtime/failed_replays.py).
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

from graphprof.capture.host_nodes import host_function
from graphprof.capture.dropped_grads import GradDrop
from graphprof.passes.records import CAPTURE

#: Marks a node that drops gradients where eager drops them (``place_drops``).
DROPS_GRADS = "graphprof.drops_grads"


def place_drops(gm: torch.fx.GraphModule, clear: list[nn.Parameter],
                drops: list[GradDrop]) -> tuple[list[nn.Parameter], bool]:
    """Drop ``clear``'s gradients in the graph where the step dropped them after an op (``loss =
    model(x); opt.zero_grad(); loss.backward()``): a node right before the first op after each drop.
    Returns the ones a replay drops before it starts (dropped before any op, as eager did, or where
    the capture did not see it), and whether some were not seen.

    Why: until eager drops them, it holds them. A replay that dropped them
    first held less memory through the forward than eager does, and when an
    op there raised (a bad batch) it had lost what eager still held.
    """
    by_id = {id(p): p for p in clear}
    nodes = list(gm.graph.nodes)
    at = {n.name: i for i, n in enumerate(nodes)}
    first_op = next((i for i, n in enumerate(nodes) if isinstance(n.target, torch._ops.OpOverload)), len(nodes))
    at_start: list[nn.Parameter] = []
    for drop in drops:
        params = tuple(by_id.pop(id(p)) for p in clear if id(p) in drop.params and id(p) in by_id)
        where = at.get(drop.before)
        if not params or where is None:  # (an op node is never removed: not expected)
            by_id.update((id(p), p) for p in params)
            continue
        if where <= first_op:  # before any op ran: where the replay drops them too
            at_start += params
            continue

        def zero_grad(params: tuple[nn.Parameter, ...] = params) -> None:
            for p in params:
                p.grad = None
        with gm.graph.inserting_before(nodes[where]):
            dropping = gm.graph.call_function(host_function(zero_grad, "zero_grad"), ())
        dropping.meta[DROPS_GRADS] = True
        dropping.meta[CAPTURE] = drop.record
    unseen = [p for p in clear if id(p) in by_id]
    return at_start + unseen, bool(unseen)
