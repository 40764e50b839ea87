"""Tensors a replay hands the user that eager leaves with autograd's record.

A replayed graph runs under ``no_grad`` (its backward is explicit), so every
tensor it makes is a leaf without ``grad_fn``. Eager's are not: a step that
runs ``loss.backward()`` and keeps or returns ``loss`` (``self.last_logits =
logits``, ``self.losses.append(loss)``, ``return loss, logits``) leaves a
tensor whose ``requires_grad`` is True, ``is_leaf`` False and ``grad_fn`` set,
and code after the step can see that (``if out.requires_grad:``,
``print(loss)`` shows ``grad_fn=<NllLossBackward0>``).

Eager's ``grad_fn`` objects cannot be made again without running the step's
autograd, but a tensor with the same flags can: ``with_history`` gives the
replay's value (the same storage, not a copy) a node of its own, named as
eager's was, whose backward raises eager's error. That error is what eager
says too when the graph such a tensor hangs from was used by the step's own
backward (its saved tensors freed), which the capture checks
(``BackwardNodes.history_of``): a tensor whose graph the step's backward did
not use (``probs = logits.softmax(-1)`` kept off the loss's path, a backward
with ``retain_graph=True``) could still be differentiated outside the step,
which a replay cannot do, so keeping or returning one refuses the capture.

The same replay value, kept in two places or kept and returned, gets one
tensor: eager's was one object too (``with_history``'s cache).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from graphprof.capture.scalars import DataDependentError

#: Eager's words when a backward reaches nodes an earlier backward freed.
FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
         "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
         "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
         "you need to access saved tensors after calling backward.")

#: How many nodes ``history_of`` looks through for one the step's backward freed.
_WALK_LIMIT = 100_000


class BackwardNodes:
    """The autograd nodes the step's backward passes ran and freed (by sequence number), seen while the
    capture call runs: the recorder calls ``ran`` for each op a backward node dispatches, and ``enter`` /
    ``exit`` around each backward entry point."""

    def __init__(self, made_here: Callable[[torch.Tensor], bool],
                 handed: Callable[[torch.Tensor, str | None, str], None] = lambda tensor, name, where: None) -> None:
        #: Whether the call's ops made a tensor: not one from before it (kept from an earlier call, read
        #: where kept) nor an argument, which a replay hands out as they are, their record and all.
        self.made_here = made_here
        #: Told of each tensor a replay hands out, the name of its record and where it is kept: what
        #: else eager's carried (its retained ``.grad``, attributes) is given it too
        #: (capture/handed_tensors.py).
        self.handed = handed
        self.freed: set[int] = set()
        self._retaining: list[bool] = []

    def enter(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self._retaining.append(_retains(func, args, kwargs))

    def exit(self) -> None:
        self._retaining.pop()

    def ran(self, node: Any) -> None:
        if self._retaining and not self._retaining[-1]:
            self.freed.add(node._sequence_nr())

    def history_of(self, tensor: torch.Tensor, where: str) -> str | None:
        """The name of eager's ``grad_fn`` of ``tensor`` (kept or returned: ``where`` holds it) when a replay
        gives it one (``with_history``); None when it has none; refuses one a replay cannot give."""
        name = self._name_of(tensor, where)
        self.handed(tensor, name, where)
        return name

    def _name_of(self, tensor: torch.Tensor, where: str) -> str | None:
        grad_fn = tensor.grad_fn
        if not self.made_here(tensor) or (grad_fn is None and not tensor.requires_grad):
            return None
        if grad_fn is None:  # ``torch.zeros(n, requires_grad=True)`` in the step: eager's backward fills its .grad
            raise DataDependentError(
                f"{where} holds a tensor the step makes with requires_grad=True: eager's backward gives it a "
                ".grad, which a replayed graph, without autograd's record, does not")
        if not self._used(grad_fn):
            raise DataDependentError(
                f"{where} holds a tensor autograd can still differentiate (made by {type(grad_fn).__name__}) "
                "after the step: its backward did not use that graph (off the loss's path, or kept by "
                "retain_graph=True), so a backward outside the step could, which a replayed graph, without "
                "autograd's record, cannot; detach it")
        return _eager_name(grad_fn)

    def _used(self, root: Any) -> bool:
        """Whether a node reachable from ``root`` was run and freed by the step's backward."""
        seen, todo = {id(root)}, [root]
        while todo and len(seen) < _WALK_LIMIT:
            node = todo.pop()
            if not hasattr(node, "variable") and node._sequence_nr() in self.freed:
                return True
            for nxt, _ in node.next_functions:
                if nxt is not None and id(nxt) not in seen:
                    seen.add(id(nxt))
                    todo.append(nxt)
        return False


def _retains(func: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether a backward entry point's call keeps its graph (``retain_graph``, ``create_graph``)."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return True  # not read: counted as keeping it, so nothing is taken as freed
    retain, create = bound.arguments.get("retain_graph"), bound.arguments.get("create_graph", False)
    return bool(create if retain is None else retain)


def _eager_name(grad_fn: Any) -> str:
    """``grad_fn``'s name as a tensor's text shows it (``NllLossBackward0``)."""
    name = type(grad_fn).__name__
    return grad_fn.name().rsplit("::", 1)[-1] if name == "CppFunction" else name


#: One custom Function per eager node name, its node class given that name.
_FUNCTIONS: dict[str, type[torch.autograd.Function]] = {}
#: The one leaf every rebuilt tensor hangs from: a node needs an input that requires grad.
_ANCHOR = torch.empty(0, requires_grad=True)
#: Replay value -> the tensor with history handed out for it, while the value lives.
_GIVEN: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _forward(ctx: Any, anchor: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return value.detach()


def _backward(ctx: Any, grad: torch.Tensor) -> Any:
    raise RuntimeError(FREED)


def _function(name: str) -> type[torch.autograd.Function]:
    fn = _FUNCTIONS.get(name)
    if fn is None:
        fn = _FUNCTIONS[name] = type(name, (torch.autograd.Function,), {
            "forward": staticmethod(_forward), "backward": staticmethod(_backward)})
        fn._backward_cls.__name__ = fn._backward_cls.__qualname__ = name  # type: ignore[attr-defined]
    return fn


def with_history(value: Any, name: str) -> Any:
    """``value`` (a replay's tensor) as a non-leaf that requires grad, its node named ``name``; the
    same tensor for the same value."""
    if not isinstance(value, torch.Tensor) or value.requires_grad:
        return value
    given = _GIVEN.get(value)
    if given is None:
        with torch.enable_grad():
            given = _function(name).apply(_ANCHOR, value)
        _GIVEN[value] = given
    return given
