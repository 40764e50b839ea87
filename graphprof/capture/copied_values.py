"""Host reads that copy a tensor's values where make_fx does not see them: refused.

Why: the capture recorder refuses ``.numpy()``, ``.tolist()`` and the other
reads of a tensor's values that a static graph cannot replay (or keeps them
as value guards). Some conversions read the values in C++ with graphprof's
modes off, so that no op and no refused method is seen, and their result
became a constant of the graph, the capture call's values on every replay:

* numpy's conversions go through ``Tensor.__array__`` (``np.asarray(t)``,
  ``np.array(t)``, ``(np.asarray(pred) == np.asarray(y)).mean()`` for an
  accuracy, ``schedule[t]`` for a diffusion schedule kept as a numpy array
  indexed by sampled timesteps, ``np.float64(t)``), which calls ``.numpy()``
  with the modes popped;
* DLPack's (``np.from_dlpack(t)``) through ``Tensor.__dlpack__``;
* ``torch.tensor``, ``torch.as_tensor`` and ``torch.asarray`` of a list
  holding tensors (``torch.tensor([t[0], t[1]])``) copy each one's value
  with the dispatcher's Python key excluded.

Given a tensor itself (``torch.tensor(t)``, ``torch.as_tensor(t, dtype=...)``)
they run ops make_fx records, and are not refused.
"""

from __future__ import annotations

from typing import Any

import torch

#: Tensor methods whose result holds the tensor's values, read with graphprof's modes off.
COPYING_METHODS: dict[Any, str] = {
    torch.Tensor.__array__: "numpy conversion of a tensor",
    torch.Tensor.__dlpack__: "DLPack export of a tensor",
}
_FROM_DATA = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor", torch.asarray: "torch.asarray"}
#: How deep a list given to a constructor is looked into (a batch of rows of tensors is two).
_DEPTH = 4


def copied_values(func: Any, args: tuple, kwargs: dict) -> str | None:
    """What ``func(*args, **kwargs)`` does when it builds a tensor from the values of tensors it is given
    in a list, read on the host; None for any other call."""
    name = _FROM_DATA.get(func)
    if name is None:
        return None
    data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
    return f"{name}() of a list holding tensors" if _holds_tensor(data, _DEPTH) else None


def _holds_tensor(data: Any, depth: int) -> bool:
    """Whether the list or tuple ``data`` holds a tensor, ``depth`` levels deep at most."""
    if depth == 0 or not isinstance(data, (list, tuple)):
        return False
    return any(isinstance(item, torch.Tensor) or _holds_tensor(item, depth - 1) for item in data)
