"""The names and roles a captured graph's constants get: the user's names for their tensors.

make_fx names every tensor constant ``_tensor_constant0``; the profile, the
memory model and every export show what it is to the user instead
(``layer1.0.conv1.weight``, ``optimizer0.param3.exp_avg``), read from the
``StateIndex`` discovery built (capture/state.py).
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

from graphprof.capture.state import StateIndex
from graphprof.passes.records import STATE, StateRecord, StateRole


def _safe_attr(name: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() else "_" for c in name) or "state"
    candidate, i = base, 1
    while candidate in taken:
        candidate, i = f"{base}_{i}", i + 1
    taken.add(candidate)
    return candidate


def name_state(gm: torch.fx.GraphModule, state: StateIndex) -> None:
    """Give get_attr constants the user's names and roles; rename the attributes."""
    state.refresh_gradients()
    taken: set[str] = set()
    renames: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta[STATE] = StateRecord(f"input{len(taken)}", StateRole.INPUT)
            taken.add(node.target)
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):  # torchbind objects (a ProcessGroup) keep their attribute
                continue
            record = state.describe(value) if isinstance(value, torch.Tensor) else None
            if record is None:
                role = StateRole.PARAMETER if isinstance(value, nn.Parameter) else StateRole.CONSTANT
                record = StateRecord(node.target, role)
            node.meta[STATE] = record
            if node.target not in renames:
                renames[node.target] = _safe_attr(record.name, taken)
            node.target = renames[node.target]
    for old, new in renames.items():
        value = getattr(gm, old)
        delattr(gm, old)
        if isinstance(value, nn.Parameter):
            gm.register_parameter(new, value)
        else:
            gm.register_buffer(new, value)
