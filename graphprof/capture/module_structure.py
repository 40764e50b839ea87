"""The structure of the modules a captured graph runs: their parameters, buffers, submodules and hooks.

A replay runs the graph the capture call traced through the modules as they
were. A user who replaces one between calls (``model.head = nn.Linear(...)``,
``layer.bias = nn.Parameter(...)``, a buffer) or adds or removes a forward
or backward hook would otherwise get the old modules replayed, silently. The
optimizers' step hooks and torch's global optimizer hooks are the same: a
replay runs the ones the capture call ran, so one added after it
(``opt.register_step_post_hook(log)``) never ran, silently.

Comparing every module's parameter, buffer, submodule and hook dicts on
every call would cost more than some steps' ops, so changes are counted
instead, at two places every change goes through:

* ``register_parameter``, ``register_buffer`` and ``add_module`` (which
  ``Module.__setattr__`` calls) call torch's global registration hooks:
  graphprof adds one, once, that counts and notes the module (it returns
  nothing, so every registration stays as it was);
* every hook registration takes a new id from ``RemovableHandle.next_id``.

A call compares two integers with the values after the capture call. When
one moved, ``ModuleStructure.changed`` looks closer (was one of this graph's
modules the one registered to? did a hook dict of one of them change?) and
either names the change or takes the new values as the baseline: a hook on
a tensor or a module elsewhere costs one closer look, not a capture. A hook
removed (``handle.remove()``) takes no id, so the hook dicts of the modules
that had hooks at capture are compared on every call; deleting an attribute
(``del model.head``) or writing into ``_parameters`` directly is not seen.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals
from torch.utils.hooks import RemovableHandle

#: The hook dicts of a module that change what a forward or backward computes.
HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
              "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
#: The hook dicts of a parameter (``p.register_hook``, ``register_post_accumulate_grad_hook``).
TENSOR_HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")
MODULE_GLOBAL_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_hooks_with_kwargs",
                            "_global_forward_hooks_always_called", "_global_forward_pre_hooks",
                            "_global_backward_hooks", "_global_backward_pre_hooks")
#: The hook dicts of an optimizer that run inside its ``step``, and torch's global ones.
OPTIMIZER_HOOK_DICTS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
GLOBAL_OPTIMIZER_HOOK_DICTS = ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")


class _Registrations:
    """How many parameter, buffer and module registrations have happened, and the count at each
    module's last one.

    Keyed by ``id``, each entry dropped by a weak reference's callback when its
    module is gone: a module class may define ``__eq__`` without ``__hash__``,
    and this hook runs inside the user's own ``register_parameter``, where it
    must never raise.
    """

    def __init__(self) -> None:
        self.count = 0
        self._last: dict[int, tuple[weakref.ref, int]] = {}
        self.installed = False

    def note(self, module: nn.Module, name: str, value: Any) -> None:
        self.count += 1
        key = id(module)
        entry = self._last.get(key)
        try:
            ref = entry[0] if entry is not None else weakref.ref(module, self._forget(key))
        except TypeError:  # not weakly referable: only the global count notes it
            return
        self._last[key] = (ref, self.count)

    def _forget(self, key: int) -> Callable[[weakref.ref], None]:
        """The callback that drops a module's entry when it is gone (before its id can be reused)."""
        def forget(_: weakref.ref) -> None:
            self._last.pop(key, None)
        return forget

    def last(self, module: nn.Module) -> int:
        """The count at ``module``'s last registration (0 if none since it was made)."""
        entry = self._last.get(id(module))
        return entry[1] if entry is not None and entry[0]() is module else 0

    def install(self) -> None:
        """Add the counting hook to torch's registration hooks (once per process).

        Dynamo is kept out of it: a compiled forward that assigns a buffer
        (segmented capture) traced the hook and guarded on the size of
        ``_last``, which every GraphModule compiling makes changes, so the
        forward compiled again on every call.
        """
        if not self.installed:
            self.installed = True
            note = torch._dynamo.disable(self.note)
            module_globals.register_module_parameter_registration_hook(note)
            module_globals.register_module_buffer_registration_hook(note)
            module_globals.register_module_module_registration_hook(note)


REGISTRATIONS = _Registrations()


def hook_functions(modules: Sequence[nn.Module]) -> list[Any]:
    """The hooks the modules, their parameters and torch's global hook dicts hold: user code that
    runs inside the step (``register_forward_hook(lambda m, i, o: acts.append(o.mean().item()))``),
    whose own state is the step's to watch (capture/reachable.py). torch's and graphprof's own
    hooks are left out."""
    dicts = [getattr(m, name, None) for m in modules for name in HOOK_DICTS]
    dicts += [getattr(p, name, None) for m in modules for p in m._parameters.values() if p is not None
              for name in TENSOR_HOOK_DICTS]
    dicts += [getattr(module_globals, name, None) for name in MODULE_GLOBAL_HOOK_DICTS]
    return _user_hooks(dicts)


def _user_hooks(dicts: list[Any]) -> list[Any]:
    """The hooks in ``dicts`` (None: no dict), each once, but torch's and graphprof's own; of torch's,
    the user's functions they close over (``register_multi_grad_hook(params, fn)`` registers a hook of
    torch's on each tensor that calls ``fn`` once all their gradients are ready)."""
    found: dict[int, Any] = {}
    for hooks in dicts:
        for hook in (hooks or {}).values():
            for user_hook in [hook] if _users(hook) else _closed_over(hook) if _owner(hook).startswith("torch") else []:
                found.setdefault(id(user_hook), user_hook)
    return list(found.values())


def _owner(value: Any) -> str:
    return getattr(value, "__module__", None) or type(value).__module__ or ""


def _users(value: Any) -> bool:
    return not _owner(value).startswith(("torch", "graphprof"))


def _closed_over(hook: Any) -> list[Any]:
    """The user's callables in the closure of a hook function of torch's."""
    cells = getattr(hook, "__closure__", None) or ()
    values = []
    for cell in cells:
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return [v for v in values if callable(v) and not isinstance(v, type) and _users(v)]


def optimizer_hook_functions(optimizers: Sequence[Any]) -> list[Any]:
    """The step hooks the optimizers and torch's global optimizer hook dicts hold
    (``opt.register_step_post_hook(lambda o, a, k: log.append(...))``): user code that runs inside the
    step, whose state is the step's to watch, as a module hook's is (``hook_functions``)."""
    dicts = [getattr(o, name, None) for o in optimizers for name in OPTIMIZER_HOOK_DICTS]
    dicts += [getattr(optimizer_globals, name, None) for name in GLOBAL_OPTIMIZER_HOOK_DICTS]
    return _user_hooks(dicts)


def _members(module: nn.Module) -> tuple:
    """A module's parameters, buffers and submodules: (names, objects) of each dict (by ``keys()``: a
    scripted module's dicts are wrappers that cannot be iterated)."""
    return tuple((tuple(d.keys()), tuple(d.values())) for d in (module._parameters, module._buffers, module._modules))


def _same_members(now: tuple, then: tuple | None) -> bool:
    """The same names holding the very same objects (compared by identity: tensors have no plain ``==``)."""
    return then is not None and all(names == old_names and len(values) == len(old_values)
                                    and all(map(operator.is_, values, old_values))
                                    for (names, values), (old_names, old_values) in zip(now, then))


def _hook_keys(module: Any, names: Sequence[str]) -> tuple:
    return tuple(tuple(getattr(module, name, None) or ()) for name in names)


class ModuleStructure:
    """What a graph was traced through, and the counts after its capture call."""

    __slots__ = ("modules", "optimizers", "counts", "_hooks", "_hooked", "_global_dicts", "_globals", "_members",
                 "_kept")

    def __init__(self, modules: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        """``modules``: those the step runs (none for an optimizer-only step, which names its model and
        never runs it); ``optimizers``: those it steps."""
        REGISTRATIONS.install()  # before the capture call; the counts are taken after it (``settle``)
        self.modules = tuple(modules)
        self.optimizers = tuple(optimizers)
        #: torch's global hook dicts (holder, names, what) that run inside such a step.
        self._global_dicts = (
            ([(module_globals, MODULE_GLOBAL_HOOK_DICTS, "global module hook")] if self.modules else [])
            + ([(optimizer_globals, GLOBAL_OPTIMIZER_HOOK_DICTS, "global optimizer hook")] if self.optimizers else []))
        #: [registrations, next hook id] after the capture call (a list: the generated check reads it).
        self.counts = [-1, -1]
        self._hooks: tuple = ()
        self._hooked: tuple = ()
        self._globals: tuple = ()
        self._members: dict[int, tuple] = {}
        #: (id(module), buffer name) of buffers the graph reads where they are kept (the step replaces them).
        self._kept: frozenset[tuple[int, str]] = frozenset()

    def settle(self) -> None:
        """Take the counts and hook dicts as they are after the capture call: the modules' and their
        parameters' (a gradient hook changes what backward computes as a module hook does)."""
        self.counts[:] = [REGISTRATIONS.count, RemovableHandle.next_id]
        holders: list[tuple[Any, tuple[str, ...], str]] = [(m, HOOK_DICTS, type(m).__name__) for m in self.modules]
        holders += [(p, TENSOR_HOOK_DICTS, f"{type(m).__name__}'s parameter {name}")
                    for m in self.modules for name, p in m._parameters.items() if p is not None]
        holders += [(o, OPTIMIZER_HOOK_DICTS, f"{type(o).__name__} optimizer's step") for o in self.optimizers]
        self._hooks = tuple((obj, names, what, _hook_keys(obj, names)) for obj, names, what in holders)
        self._hooked = tuple((obj, names, keys) for obj, names, _, keys in self._hooks if any(keys))
        self._globals = tuple((obj, names, what, _hook_keys(obj, names)) for obj, names, what in self._global_dicts)
        self._members = {id(m): self._members_of(m) for m in self.modules}

    def read_where_kept(self, buffers: Iterable[tuple[nn.Module, str]]) -> None:
        """Buffers the step replaces, which the graph reads where they are kept: a new one in their place
        is this graph's own doing, not a change (compared by name only)."""
        self._kept = frozenset((id(m), name) for m, name in buffers)

    def _members_of(self, m: nn.Module) -> tuple:
        members = _members(m)
        if not self._kept:
            return members
        names, values = members[1]
        kept = tuple(None if (id(m), n) in self._kept else v for n, v in zip(names, values))
        return (members[0], (names, kept), members[2])

    @property
    def hooks_to_compare(self) -> bool:
        """Whether a call must compare hook dicts too (some module, or the globals, had hooks at capture)."""
        return bool(self._hooked) or any(any(keys) for _, _, _, keys in self._globals)

    def counts_hold(self) -> bool:
        """The per-call test: nothing registered anywhere since, and the hooks that were there still are."""
        return (REGISTRATIONS.count == self.counts[0] and RemovableHandle.next_id == self.counts[1]
                and all(_hook_keys(obj, names) == keys for obj, names, keys in self._hooked)
                and all(not any(keys) or _hook_keys(obj, names) == keys for obj, names, _, keys in self._globals))

    def changed(self) -> str | None:
        """None when the modules are as at capture (new counts that concern none of them are taken as
        the baseline), else the phrase naming what changed."""
        if self.counts_hold():
            return None
        since = self.counts[0]
        for m in self.modules:
            # Assigning what a module already holds (``self.n_averaged += 1`` on a buffer, in a step
            # another path captured) registers it again, and changes nothing this graph reads.
            if REGISTRATIONS.last(m) > since and not _same_members(self._members_of(m), self._members.get(id(m))):
                return f"a parameter, buffer or submodule of a {type(m).__name__} was assigned"
        for obj, names, what, keys in self._hooks:
            if _hook_keys(obj, names) != keys:
                return f"a hook of a {what} was added or removed"
        for obj, names, what, keys in self._globals:
            if _hook_keys(obj, names) != keys:
                return f"a {what} was added or removed"
        self.counts[:] = [REGISTRATIONS.count, RemovableHandle.next_id]  # elsewhere: not this graph's business
        return None
