"""Copies of the buffers a replay writes before a gradient scaler's check, to put back when it fails.

A replay that stops at an overflow check (capture/grad_scaler.py) runs the
call again eagerly, which is eager's outcome only when the user's state is
as the call found it. BatchNorm's forward writes ``running_mean``,
``running_var`` and ``num_batches_tracked`` before the check, so without a
copy every AMP step of a model with BatchNorm ran as segments. These
buffers are small (a few hundred kilobytes for a ResNet-50), so a replay of
such a graph copies their storage, whole, at its start (one
``torch._foreach_copy_`` into buffers allocated once) and copies it back
when the replay raises. A whole storage, not the tensor: a write through
any view of a buffer lands in it. runtime/failed_replays.py decides which
buffers (``refuse_unsafe_overflow_checks``); graphs without overflow checks,
or whose checks come before any write, copy nothing.

The copy is made before the graph runs, outside every timed node: a
recorded step's wall time includes it, no op's time does.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx

#: The most storage (bytes, all buffers together) a replay copies to put back (BatchNorm's statistics
#: of a large ResNet take about a megabyte).
KEPT_BUFFER_BYTES = 8 * 2**20


def attribute(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """The value of ``gm``'s ``get_attr`` node ``node``: the user's own tensor (capture/whole_step.py)."""
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each distinct storage of ``tensors`` once, as a flat uint8 tensor over all of its bytes."""
    seen: dict[tuple[torch.device, int], torch.Tensor] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key not in seen:
            seen[key] = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    return list(seen.values())


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages of ``tensors``."""
    return sum(s.numel() for s in _storages(tensors))


class KeptBuffers:
    """The storage of some buffers, copied at each replay's start (``take``) and put back (``put_back``)."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self._originals = _storages(tensors)
        self._copies = [torch.empty_like(s) for s in self._originals]

    def take(self) -> None:
        torch._foreach_copy_(self._copies, self._originals)

    def put_back(self) -> None:
        torch._foreach_copy_(self._originals, self._copies)
