"""Custom ``torch.autograd.Function``s: their backward belongs to the code that applied them.

The recorder ties a backward op to the forward op it differentiates through
autograd sequence numbers, taking the first differentiable op after the
counter moved. A custom Function's forward runs with grad mode off, so its
ops create no autograd node: the Function's own node is matched only by luck
(its forward's first op), and when it is applied outside any module its ops
look like untracked work (phase ``other``). During capture ``Function.apply``
is wrapped: its outputs' backward node is tied explicitly to a record of the
application (the applying module, the line that applied it, phase forward),
and ops inside the forward without a module of their own get that module and
phase.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch.autograd.function import Function


class FunctionApplies:
    """Wraps ``Function.apply`` for the length of one capture.

    ``enter(args)`` returns the application's record and ``exit()`` ends
    it; ``link(seq, record)`` ties the backward node numbered ``seq`` to it.
    """

    def __init__(self, enter: Callable[[tuple], Any], exit: Callable[[], Any],
                 link: Callable[[int, Any], None]) -> None:
        self.enter = enter
        self.exit = exit
        self.link = link

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        original = Function.__dict__["apply"]
        applies = self

        def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
            record = applies.enter(args)
            try:
                out = original.__func__(cls, *args, **kwargs)
            finally:
                applies.exit()
            for t in pytree.tree_leaves(out):
                node = t.grad_fn if isinstance(t, torch.Tensor) else None
                if node is not None and getattr(node, "_forward_cls", None) is cls:
                    applies.link(node._sequence_nr(), record)
            return out

        Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            Function.apply = original  # type: ignore[method-assign]
