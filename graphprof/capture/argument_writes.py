"""Changes a step makes to the lists and dicts it is given, replayed into the caller's own objects.

``labels = batch.pop("labels")``, ``batch["x"] = batch["x"].float()``,
``history.append(loss.item())`` with ``history`` an argument, ``state["step"]
+= 1``: eager changes the caller's list or dict, which the caller then sees.
The capture calls the step with containers rebuilt from the flattened
arguments (make_fx traces the tensors inside them), so the step changed the
rebuilt ones; the caller's were left as they were, by the capture call and
by every replay, silently.

``ArgumentWrites`` notes every list and dict among the arguments before the
step and compares after it. Each changed one becomes part of one effect at
the graph's end that gives the caller's container, found by its path in that
call's arguments, its new items: an item the call was given (the same
tensor, number or container, wherever it was) is taken from that call's
arguments, a value the step made is the replay's own (a tensor an op made,
a number computed from inputs), anything else the same constant. The
capture call's own changes are made the same way, when nothing can refuse
the capture any more.

The tensors a step is given are the caller's own, in the capture call and
in a replay; a step that sets ``x.requires_grad_()`` on one and gets
``x.grad`` from a backward (an FGSM-style adversarial step) changed them in
the capture call only. The same effect sets the flag and the gradient on
each replay's tensors.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from graphprof.capture.arguments import argument_label
from graphprof.capture.batches import field_names, is_batch_object
from graphprof.capture.host_nodes import effect_node, filled, real_values, template_of

#: How a final item is found: ("at", path) in the call's arguments, or ("new", index) of the step's values.
_Item = tuple[str, Any]


@dataclass
class _Container:
    """A list or dict among the rebuilt arguments, where it is and what it held before the step."""

    path: tuple  # pytree key entries from (args, kwargs)
    obj: Any
    before: list[tuple[Any, Any]]  # its items as ``_pairs`` gives them


@dataclass(frozen=True)
class _Change:
    """A container's new items: (key or None, how to find the item) in order."""

    path: tuple
    items: tuple[tuple[Any, _Item], ...]


def _at(root: Any, path: tuple) -> Any:
    for key in path:
        root = key.get(root)
    return root


class ArgumentWrites:
    """The lists and dicts a step was given, watched for changes during its capture."""

    def __init__(self, rebuilt: tuple[tuple, dict], placed: list[Any], leaf_paths: list[tuple],
                 names: list[str]) -> None:
        self._containers: list[_Container] = []
        #: id of each object the step was given (a container or a leaf as placed) -> its path.
        self._given: dict[int, tuple] = {id(leaf): path for leaf, path in zip(placed, leaf_paths)}
        self._names = names
        self._walk(rebuilt, ())
        #: Each tensor given, with its ``requires_grad`` and ``.grad`` before the step.
        self._tensors = [(t, t.requires_grad, t.grad) for t in placed if isinstance(t, torch.Tensor)]
        self._changes: tuple[_Change, ...] = ()
        #: Tensors given whose flag or gradient the step changed: (index of the tensor in the replay's
        #: values, its ``requires_grad`` after the step, index of its new ``.grad`` or None if unchanged).
        self._flags: tuple[tuple[int, bool, int | None], ...] = ()
        self._capture_values: list[Any] = []
        #: The (args, kwargs) of the call being replayed: set by the runner, dropped by the effect.
        self.current: tuple[tuple, dict] | None = None

    def _walk(self, value: Any, path: tuple) -> None:
        mutable = isinstance(value, (list, dict)) or is_batch_object(value)
        if mutable and len(path) >= 2:  # (args, kwargs) and ``**kwargs`` are the step's own
            self._given[id(value)] = path
            self._containers.append(_Container(path, value, _pairs(value)))
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self._walk(item, (*path, pytree.SequenceKey(i)))
        elif isinstance(value, (dict, collections.UserDict)):
            for key, item in value.items():
                self._walk(item, (*path, pytree.MappingKey(key)))
        elif is_batch_object(value):  # a dataclass: its fields
            for name in field_names(value):
                self._walk(getattr(value, name), (*path, pytree.GetAttrKey(name)))

    def __bool__(self) -> bool:
        return bool(self._changes or self._flags)

    def effects(self, graph: torch.fx.Graph, node_of: Callable[[torch.Tensor], Any],
                source: Callable[[str], str], record: Any,
                history: Callable[[torch.Tensor, str], str | None] | None = None) -> None:
        """After the step: one effect node giving each changed container its new items on every replay
        (``history``: eager's ``grad_fn`` name of a tensor put there, capture/kept_history.py)."""
        changes: list[_Change] = []
        new: list[Any] = []
        for c in self._containers:
            now = _pairs(c.obj)
            if len(now) == len(c.before) and all((k is j or k == j) and v is w
                                                 for (k, v), (j, w) in zip(now, c.before)):
                continue
            items: list[tuple[Any, _Item]] = []
            for key, value in now:
                where = self._given.get(id(value))
                if where is not None:
                    items.append((key, ("at", where)))
                else:
                    items.append((key, ("new", len(new))))
                    new.append(value)
            changes.append(_Change(c.path, tuple(items)))
        # ``x.requires_grad_()`` on an input, and the ``x.grad`` a backward then gives it (FGSM-style
        # adversarial steps): the capture call changed the caller's tensor itself, replays must too.
        flags = []
        for t, requires_grad, grad in self._tensors:
            if t.requires_grad is not requires_grad or t.grad is not grad:
                flags.append((len(new), t.requires_grad, None if t.grad is grad else len(new) + 1))
                new += [t, t.grad]
        self._containers, self._tensors = [], []  # the capture call's objects: not kept with the graph
        if not changes and not flags:
            return
        labels = ", ".join([argument_label(c.path, self._names) for c in changes] + (["inputs"] if flags else []))
        template, slots = template_of(new, node_of, labels, source, history=history)
        self._changes, self._flags = tuple(changes), tuple(flags)
        self._capture_values = real_values(new)
        effect_node(graph, f"update {labels}", lambda vals: self._replay(filled(template, vals)), slots, record)

    def _replay(self, values: list[Any]) -> None:
        root, self.current = self.current, None  # the call's arguments are not kept past its replay
        if self._changes:
            assert root is not None, "a replay that changes its arguments is given them by its runner"
            self._apply(root, values)
        for tensor, requires_grad, grad in self._flags:
            values[tensor].requires_grad_(requires_grad)
            if grad is not None:
                values[tensor].grad = values[grad]

    def _apply(self, root: Any, values: list[Any]) -> None:
        # Every item is found before any container changes: ``batch["y"] = batch.pop("labels")``.
        resolved = []
        for change in self._changes:
            target = _at(root, change.path)
            pairs = [(key, _at(root, where) if kind == "at" else values[where]) for key, (kind, where) in change.items]
            resolved.append((target, pairs))
        for target, pairs in resolved:
            _fill(target, pairs)

    def commit(self, args: tuple, kwargs: dict) -> None:
        """Make the capture call's own changes in the caller's containers, once nothing can refuse
        the capture any more (a refused one leaves them as they were, for the fallback to run).
        Tensors' flags and gradients the capture call set are the caller's already."""
        if self._changes:
            self._apply((args, kwargs), self._capture_values)
        self._capture_values = []


def _pairs(obj: Any) -> list[tuple[Any, Any]]:
    """A list's items as (None, item), a dict's or ``UserDict``'s as (key, value), a dataclass's
    fields as (name, value), in order."""
    if isinstance(obj, list):
        return [(None, item) for item in obj]
    if isinstance(obj, (dict, collections.UserDict)):
        return list(obj.items())
    return [(name, getattr(obj, name)) for name in field_names(obj)]


def _fill(target: Any, pairs: list[tuple[Any, Any]]) -> None:
    """Give ``target`` (the same object) exactly these items, in this order."""
    if isinstance(target, list):
        target[:] = [item for _, item in pairs]
    elif isinstance(target, dict):
        target.clear()
        target.update(pairs)
    elif isinstance(target, collections.UserDict):  # its own dict, as its __setitem__ and pop change it
        target.data.clear()
        target.data.update(pairs)
    else:
        for name, value in pairs:
            object.__setattr__(target, name, value)
