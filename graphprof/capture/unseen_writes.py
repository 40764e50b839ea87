"""What the trace cannot see the step do with tensors, found around it and refused.

make_fx records aten ops. Reading tensors from an argument torch's
flattening does not open (a ``UserDict`` batch, a dataclass, a plain object)
is none: the argument is one opaque value of the signature, so the graph
holds its tensors as the capture call's constants. It is found by looking
after the trace, and refuses the capture. (Giving a parameter new data,
``p.data = ...``, is no op either: capture/data_assignments.py replays it.)

And one thing it reads: a tensor that is neither an argument nor state the
step reaches (parameters, buffers, optimizer state, gradients, tensors it
keeps by name, which are read where they are kept) nor made by the step
(``torch.tensor(...)`` in it is lifted fresh). A batch drawn from an
iterator (``x, y = next(loader_iter)``, a generator, ``get_batch()`` over a
list of batches) is such a tensor: make_fx holds it as a constant, and every
replay trained on the capture call's batch again, silently. So is a tensor
kept deeper in objects than the step's state is watched. Such a graph is
refused (``refuse_unknown_constants``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from graphprof.capture.scalars import DataDependentError
from graphprof.passes.records import CAPTURE


def tensors_in_argument_objects(leaves: list[Any]) -> dict[int, str]:
    """id -> where, for each tensor inside an argument that is not a list, tuple or dict (a
    ``UserDict`` or ``BatchEncoding`` batch, a dataclass, a plain object).

    Such an argument is one opaque value of the signature, told apart by
    identity: a loop that refills the same batch object between calls would
    replay the capture call's tensors, so a graph reading one is refused.
    """
    found: dict[int, str] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) or type(leaf).__module__.startswith("torch"):
            continue  # torch's own objects (an optimizer passed in) hold model state, read where it lives
        if isinstance(leaf, Mapping):
            inner: Any = list(leaf.values())
        elif hasattr(leaf, "__dict__") and not isinstance(leaf, (type, nn.Module)):
            inner = list(vars(leaf).values())
        else:
            continue
        for t in pytree.tree_leaves(inner):
            if isinstance(t, torch.Tensor):
                found.setdefault(id(t), f"argument {i} (flattened), a {type(leaf).__name__}")
    return found


def refuse_unknown_constants(gm: torch.fx.GraphModule, known: set[int]) -> None:
    """Refuse a graph holding a constant tensor whose origin is unknown (see the module's docstring):
    not in ``known`` (ids of the state the graph holds), and not only lifted fresh by a
    ``torch.tensor(...)`` the step made."""
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target, None)
        if not isinstance(value, torch.Tensor) or id(value) in known:
            continue
        if node.users and all(u.target is _LIFT_FRESH for u in node.users):
            continue
        user = next(iter(node.users), None)
        record = user.meta.get(CAPTURE) if user is not None else None
        where = getattr(record, "source", "")
        raise DataDependentError(
            f"the step reads a tensor of shape {list(value.shape)} that is neither an argument nor state it "
            f"reaches by name (a batch drawn from an iterator, a tensor kept deeper in objects)"
            f"{f' at {where}' if where else ''}, which a replayed graph would read again as the capture "
            "call's constant")


_LIFT_FRESH = torch.ops.aten.lift_fresh_copy.default
