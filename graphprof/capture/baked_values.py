"""Python values a captured graph holds as constants: optimizer flags, module modes, held values.

A replayed graph does not run the step's Python, so whatever Python decided
from these values during the capture call is fixed in the graph: the
optimizer's non-number hyperparameters (``foreach``, ``nesterov``,
``maximize``, a tensor learning rate; numbers are read at run time, see
capture/inputs.py) and every module's ``training`` flag. Before each replay
``CapturedPaths.select`` (tracing/captured_paths.py) asks whether any of them changed since the graph was
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
from typing import Any, Callable

import torch

from graphprof.capture.held_values import HeldValue, compile_held_check, first_change
from graphprof.capture.module_structure import ModuleStructure
from graphprof.capture.state import StateIndex

RUNTIME = "read at run time"
_TRAINING = operator.attrgetter("training")
_MIXED = object()  # BakedValues._same_mode where the modules' modes differ
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


def guard_values(state: StateIndex, modes_read: bool = True) -> tuple:
    """Python values baked into a graph: optimizer flags (foreach, amsgrad, ...), module modes (none
    where the step read no flag)."""
    hyper = tuple(
        tuple((k, baked(v)) for k, v in group.items() if k != "params")
        for opt in state.optimizers for group in opt.param_groups
    )
    modes = tuple(map(_TRAINING, state.module_objects())) if modes_read else ()
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


def _group_test(group: dict) -> Callable[[dict], bool]:
    """An exact test that a param_groups dict still bakes as ``group`` does now, as generated code.

    It passes only for the same dict object with the identical keys in the
    same order and values of the identical types. The type alone then decides
    ``baked`` for an exact ``float`` or ``int`` (always ``RUNTIME``); exact
    bools and None are compared by identity (they are singletons) and exact
    strings with ``==``, as the descriptive tuples compare them; every other
    value (a tensor, a tuple, a subclass of a number or of str) goes through
    ``baked`` itself and is compared as a tuple, as those tuples are. The
    test is straight-line code with no loop and no call but ``len``, ``type``
    and ``baked``: on a step of tiny ops it runs right after the graph, when
    little of graphprof's code is still in the processor's caches.
    """
    names: dict[str, Any] = {"_group": group, "baked": baked}
    keys, values = list(group), list(group.values())
    lines = ["def same(group):", f"    if group is not _group or len(group) != {len(keys)}:", "        return False"]
    if keys:
        k = [f"k{i}" for i in range(len(keys))]
        v = [f"v{i}" for i in range(len(keys))]
        names.update({f"_K{i}": key for i, key in enumerate(keys)})
        names.update({f"_T{i}": type(value) for i, value in enumerate(values)})
        lines += [f"    {', '.join(k)}, = group",
                  f"    if {' or '.join(f'{k[i]} is not _K{i}' for i in range(len(keys)))}:", "        return False",
                  f"    {', '.join(v)}, = group.values()",
                  f"    if {' or '.join(f'type({v[i]}) is not _T{i}' for i in range(len(keys)))}:", "        return False"]
        plain, other = [], []
        for i, (key, value) in enumerate(zip(keys, values)):
            if key == "params" or type(value) in _NUMBERS:
                continue
            if type(value) is bool or value is None:
                names[f"_V{i}"] = value
                plain.append(f"{v[i]} is not _V{i}")
            elif type(value) is str:
                names[f"_V{i}"] = value
                plain.append(f"{v[i]} != _V{i}")
            else:
                other.append(i)
        if plain:
            lines += [f"    if {' or '.join(plain)}:", "        return False"]
        if other:
            names["_other"] = tuple(baked(values[i]) for i in other)
            lines += [f"    if ({''.join(f'baked({v[i]}), ' for i in other)}) != _other:", "        return False"]
    lines.append("    return True")
    exec(compile("\n".join(lines), "<graphprof baked values>", "exec"), names)  # noqa: S102 - our own generated text
    return names["same"]  # type: ignore[no-any-return]


class BakedValues:
    """The values baked into one captured graph, and whether this call's differ."""

    __slots__ = ("state", "held", "held_check", "structure", "values", "group_tests", "modes", "modes_read",
                 "_same_mode")

    def __init__(self, state: StateIndex, held: tuple[HeldValue, ...] = (),
                 structure: ModuleStructure | None = None, modes: tuple[Any, ...] | None = None,
                 modes_read: bool = True) -> None:
        self.state = state
        #: The watched Python values the step's decisions were made on, and their generated test.
        self.held = held
        self.held_check = compile_held_check(held)
        #: The modules' parameters, buffers, submodules and hooks (capture/module_structure.py).
        self.structure = structure
        #: Whether the step read any module's ``training`` flag (capture/name_reads.py, ``unnamed_attributes``).
        self.modes_read = modes_read
        now = guard_values(state, modes_read)
        # The flags the step found (capture/switched_flags.py): a step's own ``model.train()`` is replayed.
        self.values = now if modes is None or not modes_read else (now[0], modes)
        groups = [g for opt in state.optimizers for g in opt.param_groups]
        # Plain dicts only: a dict's type cannot change later, a subclass may override items().
        self.group_tests = tuple(map(_group_test, groups)) if all(type(g) is dict for g in groups) else None
        #: Each module's ``training`` flag when the capture call began, in ``state.module_objects()`` order.
        self.modes = self.values[1]
        first = self.modes[0] if self.modes else _MIXED
        self._same_mode = first if all(m is first for m in self.modes) else _MIXED

    def changed(self) -> str | None:
        """None when every baked value is as it was at capture, else the phrase naming the first change."""
        if not self._unchanged():
            now = guard_values(self.state, self.modes_read)
            if now != self.values:
                return what_changed(self.values, now, self.state)
        if not self.held_check():
            return first_change(self.held)
        return self.structure.changed() if self.structure is not None else None

    def _unchanged(self) -> bool:
        """An exact sufficient test that ``guard_values(state)`` equals the captured values.

        It walks the optimizers and groups as ``guard_values`` does and reads
        every module's flag: nothing is skipped, only compared more cheaply.
        """
        checks = self.group_tests
        if checks is None:
            return False
        i = 0
        for opt in self.state.optimizers:
            for group in opt.param_groups:
                if i == len(checks) or not checks[i](group):
                    return False
                i += 1
        if i != len(checks):
            return False
        if not self.modes_read:
            return True
        objects = self.state.module_objects()
        if len(objects) != len(self.modes):
            return False
        # A plain loop: fewer of the interpreter's paths than map and all, right after the graph ran.
        same = self._same_mode
        if same is not _MIXED:  # every module was in one mode (the usual case): compared with that
            for module in objects:
                if module.training is not same:
                    return False
            return True
        for module, mode in zip(objects, self.modes):
            if module.training is not mode:
                return False
        return True
