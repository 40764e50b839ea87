"""Python values a captured graph holds as constants: optimizer flags and module modes.

A replayed graph does not run the step's Python, so whatever Python decided
from these values during the capture call is fixed in the graph: the
optimizer's non-number hyperparameters (``foreach``, ``nesterov``,
``maximize``, a tensor learning rate; numbers are read at run time, see
capture/inputs.py) and every module's ``training`` flag. Before each replay
``tracing._select`` asks whether any of them changed since the graph was
captured; if one did, it takes or captures another graph.

That question is asked on every call, and on a step of tiny ops the answer's
cost is a visible share of the step: the descriptive tuple
(``guard_values``) reads each group's items through ``baked`` and builds
nested tuples. ``BakedValues.changed`` first runs an exact cheaper test
(same group objects, same keys, same value types, the same
non-number values, the same modes): when it passes, the descriptive tuple
would be equal, so it is not built. When it does not pass (a learning rate
of another type, a group added or replaced), the descriptive tuple decides,
as before; the cheaper test never says "unchanged" where it would not.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from graphprof.capture.state import StateIndex

RUNTIME = "read at run time"
_TRAINING = operator.attrgetter("training")
#: Types whose baked value is the value itself and whose ``==`` is plain equality.
_PLAIN_VALUES = frozenset({bool, type(None), str})
#: Types whose every value bakes as ``RUNTIME``.
_NUMBERS = frozenset({float, int})


def baked(value: Any) -> Any:
    """How a param_groups value is held by a graph: numbers are read at run time, the rest baked."""
    if type(value) is float or type(value) is int:  # the common case first
        return RUNTIME
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) or (isinstance(value, tuple) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        return RUNTIME
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))  # a tensor lr: updated in place is fine, replaced is not
    return ("object", type(value).__name__)


def guard_values(state: StateIndex) -> tuple:
    """Python values baked into a graph: optimizer flags (foreach, amsgrad, ...), module modes."""
    hyper = tuple(
        tuple((k, baked(v)) for k, v in group.items() if k != "params")
        for opt in state.optimizers for group in opt.param_groups
    )
    modes = tuple(map(_TRAINING, state.module_objects()))
    return hyper, modes


def what_changed(old: tuple, new: tuple, state: StateIndex) -> str:
    """One phrase naming the first baked value that differs."""
    (old_hyper, old_modes), (new_hyper, new_modes) = old, new
    for g, (a, b) in enumerate(zip(old_hyper, new_hyper)):
        for (k, va), (_, vb) in zip(a, b):
            if va != vb:
                return f"optimizer param_groups[{g}]['{k}'] changed from {va!r} to {vb!r}"
    names = [name for name, _ in state.modules.values()]
    for name, a, b in zip(names, old_modes, new_modes):
        if a != b:
            return f"module '{name or 'model'}' switched to {'train' if b else 'eval'} mode"
    return "optimizer settings or module modes changed"


class _Group:
    """One param_groups dict as it was at capture, and an exact test that it still bakes the same.

    The same dict object with the identical keys in the same order and
    values of the identical types bakes the same wherever the type alone
    decides: an exact ``float`` or ``int`` is always ``RUNTIME``. Exact
    bools, None and strings bake as themselves and are compared in one tuple
    comparison, as the descriptive tuples' comparison compares them. Every
    other value (a tensor, a tuple, a subclass of a number or of str) goes
    through ``baked`` itself, compared as a tuple too.
    """

    __slots__ = ("group", "keys", "types", "plain", "plain_values", "other", "other_values")

    def __init__(self, group: dict) -> None:
        self.group = group
        self.keys = tuple(group)
        self.types = tuple(map(type, group.values()))
        entries = [(k, t) for k, t in zip(self.keys, self.types) if k != "params"]
        self.plain = _getter(tuple(k for k, t in entries if t in _PLAIN_VALUES))
        self.plain_values = self.plain(group)
        self.other = tuple(k for k, t in entries if t not in _PLAIN_VALUES and t not in _NUMBERS)
        self.other_values = tuple(baked(group[k]) for k in self.other)

    def same(self, group: dict) -> bool:
        """Whether ``group`` (the current one at this position) bakes as the captured one did."""
        if group is not self.group or len(group) != len(self.keys):
            return False
        if not all(map(operator.is_, group, self.keys)):
            return False
        if not all(map(operator.is_, map(type, group.values()), self.types)):
            return False
        if self.plain(group) != self.plain_values:
            return False
        return not self.other or tuple(baked(group[k]) for k in self.other) == self.other_values


def _getter(keys: tuple) -> Any:
    """A function of a dict returning the tuple of its values at ``keys`` (itemgetter returns a bare
    value for one key)."""
    if len(keys) > 1:
        return operator.itemgetter(*keys)
    if keys:
        key = keys[0]
        return lambda group: (group[key],)
    return lambda group: ()


class BakedValues:
    """The values baked into one captured graph, and whether this call's differ."""

    __slots__ = ("state", "values", "_groups", "_modes")

    def __init__(self, state: StateIndex) -> None:
        self.state = state
        self.values = guard_values(state)
        groups = [g for opt in state.optimizers for g in opt.param_groups]
        # Plain dicts only: a dict's type cannot change later, a subclass may override items().
        self._groups = tuple(_Group(g) for g in groups) if all(type(g) is dict for g in groups) else None
        self._modes = self.values[1]

    def changed(self) -> str | None:
        """None when every baked value is as it was at capture, else the phrase naming the first change."""
        if self._unchanged():
            return None
        now = guard_values(self.state)
        return None if now == self.values else what_changed(self.values, now, self.state)

    def _unchanged(self) -> bool:
        """An exact sufficient test that ``guard_values(state)`` equals the captured values.

        It walks the optimizers and groups as ``guard_values`` does and reads
        every module's flag: nothing is skipped, only compared more cheaply.
        """
        checks = self._groups
        if checks is None:
            return False
        i = 0
        for opt in self.state.optimizers:
            for group in opt.param_groups:
                if i == len(checks) or not checks[i].same(group):
                    return False
                i += 1
        if i != len(checks):
            return False
        objects = self.state.module_objects()
        return len(objects) == len(self._modes) and all(map(operator.is_, map(_TRAINING, objects), self._modes))
