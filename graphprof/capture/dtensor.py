"""DTensor state (FSDP2's sharded parameters) in a whole-step graph.

``make_fx`` does not trace through a DTensor: DTensor's dispatch unwraps it
and runs the op on its local shard, so the graph records ops on
``dtensor._local_tensor`` and holds those local tensors as ``get_attr``
constants (found with torch 2.13, FSDP2 + AdamW on gloo). That is right for
a parameter or an optimizer moment, whose DTensor keeps the same local
tensor for life and is updated in place. It is wrong for a gradient: FSDP2
hands each step's reduce-scattered gradient to ``param.grad`` as a new
DTensor around a new local tensor, so a replay that used the captured one
would apply the first step's gradient forever (AdamW drifted by 1e-2 after
three steps). So gradients are read through their DTensor at run time
(``graph_constants.read_grads_at_run_time`` with ``local_shard``), the graph's
gradient outputs are the local shards and must not replace the DTensor
``.grad`` the user sees (``same_gradient``), and the names and roles of
state tensors cover their local shards too (``capture/state.py``).
"""

from __future__ import annotations

import torch

from typing import Any



def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support
        return None
    return DTensor


_DTENSOR = _dtensor_type()


def is_dtensor(value: Any) -> bool:
    return _DTENSOR is not None and isinstance(value, _DTENSOR)


def local_shard(value: Any) -> Any:
    """The tensor a graph sees for ``value``: a DTensor's local shard, any other value itself."""
    return value._local_tensor if is_dtensor(value) else value


def same_gradient(current: Any, produced: Any) -> bool:
    """True when the graph's gradient output ``produced`` already is ``current`` (or its local shard)."""
    return current is produced or (is_dtensor(current) and current._local_tensor is produced)


def check_new_gradients(params: list[Any], grads_before: dict[int, Any]) -> None:
    """Refuse a step that creates a DTensor gradient: the graph would hand back its local shard only;
    and one that makes sparse gradients (``nn.Embedding(sparse=True)``), which it does not replay.

    FSDP2 steps are refused earlier (``capture/fsdp.py``); this catches other DTensor users.
    """
    for p in params:
        if grads_before.get(id(p)) is None and is_dtensor(p.grad):
            raise RuntimeError("the step creates DTensor gradients, which a static graph would hand back as their "
                               "local shards")
        if p.grad is not None and p.grad.layout is not torch.strided:
            # A replayed SparseAdam step on them left eager's results from the first replay on.
            raise RuntimeError(f"the step makes {p.grad.layout} gradients ({tuple(p.shape)} parameter), which a "
                               "static graph does not replay as eager runs them")
