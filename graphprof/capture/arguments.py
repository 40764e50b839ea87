"""Objects a step is given as arguments: its model, optimizer or a config, watched like those it names.

``def train_step(model, opt, batch)`` is as common as a step that closes
over ``model`` and ``opt``. Torch's flattening keeps such an argument whole,
one leaf that the input signature tells apart by identity (a module, an
optimizer, an ``argparse.Namespace``), so every replay of a graph is given
the very object its capture was given. That object is then state the step
reaches, no different from a closure's: its parameters, gradients and
optimizer state are the step's (capture/state.py), and its fields are
watched (capture/reachable.py): numbers become inputs, values the step
decided on are held, values it assigns are replayed.

An object whose class compares by value (a frozen dataclass, an enum) is
not watched: two equal objects select the same graph, and the signature
compares them as their class says. Nor is one holding tensors of its own (a
batch as a dataclass or ``UserDict``): a loop passes a new one per call, and
a graph reading its tensors is refused (capture/unseen_writes.py).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from graphprof.capture.batches import flatten_call_with_path
from graphprof.capture.held_values import PLAIN_TYPES
from graphprof.capture.unseen_writes import tensors_in_argument_objects


def argument_objects(fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(label, object) for each argument leaf told apart by identity (``step(model, opt, x)``: the
    model and the optimizer), labelled by the parameter it is given as (``model``, ``batch['cfg']``)."""
    if all(type(a) in PLAIN_TYPES or isinstance(a, torch.Tensor) for a in args) and not kwargs:
        return []  # the common call: tensors and numbers only
    names = parameter_names(fn)
    found = []
    for path, leaf in flatten_call_with_path(args, kwargs):
        if _by_identity(leaf) and not tensors_in_argument_objects([leaf]):
            found.append((argument_label(path, names), leaf))
    return found


def _by_identity(leaf: Any) -> bool:
    """Whether the signature tells ``leaf`` apart by identity: not a tensor or plain value, and its
    class keeps object identity as its hash (or has none, which the signature keys by ``id``)."""
    if isinstance(leaf, torch.Tensor) or type(leaf) in PLAIN_TYPES or isinstance(leaf, type):
        return False
    return getattr(type(leaf), "__hash__", None) in (None, object.__hash__)


def parameter_names(fn: Callable[..., Any]) -> list[str]:
    """The names of ``fn``'s positional parameters (``self`` of a bound method excluded)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def argument_label(path: tuple, names: list[str]) -> str:
    """``model`` for the first positional argument of ``step(model, ...)``, ``batch['cfg']`` deeper."""
    where, first, *rest = path  # (args or kwargs, position or name, keys inside)
    index = getattr(first, "idx", None)
    if where.idx == 0 and isinstance(index, int):
        head = names[index] if index < len(names) else f"argument {index}"
    else:
        head = str(getattr(first, "key", first))
    return head + "".join(str(k) for k in rest)
