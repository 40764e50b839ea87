"""A call's arguments as flat leaves, with the batch objects torch's flattening leaves shut opened.

A tokenizer returns a ``BatchEncoding`` (a ``UserDict``), and many loops
collate into a dataclass. Torch's pytree opens lists, tuples and dicts but
keeps these whole, as one opaque leaf: the signature could only tell them
apart by identity, and the graph would hold their tensors as constants, so
such a step was refused and profiled as segments.

``flatten_call`` opens them like dicts: a ``UserDict``'s items and a
dataclass's fields become leaves of their own, and the spec keeps the
class and the keys (a ``BatchEncoding`` is not a dict with the same keys).
It does so through private wrapper nodes, registered with torch's pytree
once; the user's own classes are never registered, so the user's code sees
pytree as it was. Rebuilding one for the capture call gives the step an
object of the same class, a shallow copy of the caller's (its other
attributes, such as a fast tokenizer's encodings, shared) holding the
traced tensors; what the step changes in it reaches the caller's object
(capture/argument_writes.py).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch.utils._pytree as pytree


class _Template:
    """An empty object of the batch's class, for rebuilding it in the capture call: its other
    attributes (a fast tokenizer's encodings), none of its tensors. Equal to any other template, so
    that two batches with the same class and keys select the same graph."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Template)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return type(self.obj).__name__


class _Opened:
    """A batch object as a pytree node: its keys (a ``UserDict``'s) or field names (a dataclass's),
    its values (batch objects inside opened too), and an empty template to rebuild it from."""

    __slots__ = ("keys", "values", "template")

    def __init__(self, keys: tuple, values: list[Any], template: Any) -> None:
        self.keys, self.values, self.template = keys, values, _Template(template)


class _OpenedMapping(_Opened):
    __slots__ = ()


class _OpenedDataclass(_Opened):
    __slots__ = ()


def _flatten(node: _Opened) -> tuple[list[Any], Any]:
    return node.values, (node.keys, node.template)


def _mapping_unflatten(values: Any, context: Any) -> Any:
    keys, template = context
    new = copy.copy(template.obj)
    new.data = dict(zip(keys, values))
    return new


def _dataclass_unflatten(values: Any, context: Any) -> Any:
    names, template = context
    new = copy.copy(template.obj)
    for name, value in zip(names, values):
        object.__setattr__(new, name, value)  # a frozen dataclass too
    return new


def _mapping_keys(node: _Opened) -> tuple[list[tuple[Any, Any]], Any]:
    return [(pytree.MappingKey(k), v) for k, v in zip(node.keys, node.values)], _flatten(node)[1]


def _dataclass_keys(node: _Opened) -> tuple[list[tuple[Any, Any]], Any]:
    return [(pytree.GetAttrKey(n), v) for n, v in zip(node.keys, node.values)], _flatten(node)[1]


pytree.register_pytree_node(_OpenedMapping, _flatten, _mapping_unflatten, flatten_with_keys_fn=_mapping_keys)
pytree.register_pytree_node(_OpenedDataclass, _flatten, _dataclass_unflatten, flatten_with_keys_fn=_dataclass_keys)


def is_batch_object(value: Any) -> bool:
    """A leaf ``flatten_call`` opens: a ``UserDict`` or a dataclass instance."""
    return isinstance(value, collections.UserDict) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type))


def field_names(obj: Any) -> tuple[str, ...]:
    """A dataclass instance's field names, in order."""
    return tuple(f.name for f in dataclasses.fields(obj))


def _opened(value: Any) -> Any:
    """``value`` with every batch object inside (through lists, tuples and dicts) wrapped to open."""
    template: Any
    if isinstance(value, collections.UserDict):
        template = copy.copy(value)
        template.data = {}
        return _OpenedMapping(tuple(value.data), [_opened(v) for v in value.data.values()], template)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _opened_dataclass(value, _opened)
    if type(value) in (list, tuple):
        return type(value)(_opened(v) for v in value)
    if type(value) is dict:
        return {k: _opened(v) for k, v in value.items()}
    return value


def _opened_dataclass(value: Any, inner: Callable[[Any], Any]) -> _OpenedDataclass:
    """A dataclass instance opened: its fields' values (``inner`` of each) and an empty copy."""
    names = field_names(value)
    template = copy.copy(value)
    for name in names:
        object.__setattr__(template, name, None)
    return _OpenedDataclass(names, [inner(getattr(value, n)) for n in names], template)


def flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], pytree.TreeSpec]:
    """The call's leaves and spec, batch objects opened (the same as pytree's where there are none)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if any(map(is_batch_object, leaves)):
        leaves, spec = pytree.tree_flatten(_opened((args, kwargs)))
    return leaves, spec


def flatten_call_with_path(args: tuple, kwargs: dict) -> list[tuple[tuple, Any]]:
    """(key path, leaf) of each leaf in ``flatten_call``'s order."""
    pairs = pytree.tree_flatten_with_path((args, kwargs))[0]
    if any(is_batch_object(leaf) for _, leaf in pairs):
        pairs = pytree.tree_flatten_with_path(_opened((args, kwargs)))[0]
    return pairs


def rebuildable_output(value: Any) -> bool:
    """A dataclass instance a step returns that a replay can rebuild as eager's: one whose state is its
    fields alone (no other attribute, no ``__post_init__`` that could compute one or act on creation),
    so that a copy of an empty one, its fields set, is what the class's own ``__init__`` made."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type) or hasattr(value, "__post_init__"):
        return False
    names = set(field_names(value))
    return set(getattr(value, "__dict__", {})) <= names and all(hasattr(value, n) for n in names)


def flatten_output(out: Any) -> tuple[list[Any], pytree.TreeSpec]:
    """A step's result as leaves and spec, its returned dataclasses (``rebuildable_output``) opened: a
    replay rebuilds each from its fields, as a step returning a dict or a namedtuple is rebuilt."""
    leaves, spec = pytree.tree_flatten(out)
    if any(map(rebuildable_output, leaves)):
        leaves, spec = pytree.tree_flatten(_opened_outputs(out))
    return leaves, spec


def _opened_outputs(value: Any) -> Any:
    """``value`` with every ``rebuildable_output`` inside (through lists, tuples and dicts) wrapped to open."""
    if rebuildable_output(value):
        return _opened_dataclass(value, _opened_outputs)
    if type(value) in (list, tuple):
        return type(value)(_opened_outputs(v) for v in value)
    if type(value) is dict:
        return {k: _opened_outputs(v) for k, v in value.items()}
    return value

