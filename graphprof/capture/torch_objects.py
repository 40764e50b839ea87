"""Torch's stateful Python objects a step drives (optimizers, LR schedulers, gradient scalers), put
back as they were when a capture is refused part way.

The capture call is the user's real step: when it is refused part way (a
branch on ``loss.item()`` after ``sched.step()``), the step runs again another
way, so everything it changed must first be undone. Tensors written in place
are undone by the write log and watched Python values by ``PythonState``;
these objects are neither. A scheduler already stepped would step twice (its
``last_epoch`` and the groups' ``lr`` advanced again), and a gradient scaler
that had unscaled the gradients would skip unscaling the next ones (its
per-optimizer stage says it is done): the results would leave eager's.

``TorchObjects`` copies each object's attributes before the step, a few
container levels deep (an optimizer's ``param_groups`` list and each group's
dict, a scaler's per-optimizer states and each state's dict), and puts back
the same objects with the same items. Tensors inside are the write log's.
"""

from __future__ import annotations

import types
from typing import Any, Iterable

import torch

#: The kinds of objects whose own Python state a step changes through torch's code.
KINDS: tuple[type, ...] = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
                           torch.optim.lr_scheduler.ReduceLROnPlateau, torch.amp.GradScaler)


#: How many container levels are copied (attribute, list of groups, group, list of parameters).
_DEPTH = 4


def _items(value: Any, depth: int = _DEPTH) -> Any:
    """A copy of a list's or dict's items (None for anything else), and of the containers inside."""
    if depth == 0:
        return None
    if isinstance(value, list):
        return [(v, _items(v, depth - 1)) for v in value]
    if isinstance(value, dict):
        return [(k, v, _items(v, depth - 1)) for k, v in value.items()]
    return None


def _put_back(value: Any, items: Any) -> None:
    """Make ``value`` (the original container) hold ``items`` again, the inner containers too."""
    if items is None:
        return
    if isinstance(value, list):
        value[:] = [v for v, _ in items]
        for v, inner in items:
            _put_back(v, inner)
    else:
        value.clear()
        for k, v, inner in items:
            value[k] = v
            _put_back(v, inner)


class TorchObjects:
    """The attributes of some torch objects before a step, to put back if its capture is refused."""

    def __init__(self, objects: Iterable[Any]) -> None:
        self._saved: list[tuple[Any, list[tuple[str, Any, Any]]]] = []
        self._seen: set[int] = set()
        for obj in objects:
            self.add(obj)

    def add(self, obj: Any) -> None:
        """Copy ``obj``'s attributes now, unless they are copied already or it is not of ``KINDS``; a
        ``SequentialLR`` or ``ChainedScheduler`` with the schedulers it steps.

        Called again when a scheduler steps (capture/host_calls.py): one the step reaches
        only through another object (``self.trainer.sched``) was not found before the
        step, and a refused capture left it stepped, so that it stepped twice."""
        if isinstance(obj, types.MethodType):  # ``advance = sched.step``: the scheduler it steps
            obj = obj.__self__
        if not isinstance(obj, KINDS) or id(obj) in self._seen or not hasattr(obj, "__dict__"):
            return
        self._seen.add(id(obj))
        self._saved.append((obj, [(k, v, _items(v)) for k, v in vars(obj).items()]))
        for inner in getattr(obj, "_schedulers", None) or ():
            self.add(inner)

    def stepped_unseen(self, seen: set[int]) -> str | None:
        """The type of the first scheduler whose step count moved during the step although no patched
        ``step`` of graphprof's stepped it (``seen``: their ids); None when none did.

        A method bound before the capture (``advance = sched.step``, called in the step) holds the class's
        function of then: it ran inside the trace, unseen, and no replay would step it again."""
        for obj, attributes in self._saved:
            if id(obj) in seen or not isinstance(obj, (torch.optim.lr_scheduler.LRScheduler,
                                                       torch.optim.lr_scheduler.ReduceLROnPlateau)):
                continue
            state = vars(obj)
            if any(k in ("_step_count", "last_epoch") and state.get(k) != v for k, v, _ in attributes):
                return type(obj).__name__
        return None

    def restore(self) -> None:
        for obj, attributes in self._saved:
            state = vars(obj)
            if list(state) != [k for k, _, _ in attributes]:  # one deleted or added: in their order again
                state.clear()
            for k, v, items in attributes:
                state[k] = v
                _put_back(v, items)
