"""Hooks the step itself registers on its parameters, or removes, and leaves so: refused, and put back.

A step that calls ``torch.autograd.graph.register_multi_grad_hook(params,
fn)``, ``p.register_hook(fn)`` or ``p.register_post_accumulate_grad_hook(fn)``
on every call leaves one more hook on the parameters each time: eager's ``fn``
runs once more on every call (n times in call n). A replayed graph holds the
hooks the capture call ran, as many as it found, forever after; and the hook
the capture call added stayed when a capture was refused, so the fallback's
call added a second one where eager adds one.

So the parameters' hook dicts are compared before and after the capture
call: one the step changed and did not put back refuses the capture, and a
capture refused puts them back as they were (``restore``). A hook on a tensor
the step makes (a multi-grad hook on this call's activations) dies with it
and changes nothing here; one the step registers and removes again before it
returns is the same on every call and is replayed as the capture call ran it.

Modules' and optimizers' hooks are not compared: a library installs one
lazily, once, the first time a path needs it (transformers' hook that
collects hidden states when ``output_hidden_states`` is switched on), and
keeps a flag that it did; one capture call cannot tell that from a hook
added on every call, and taking it back would leave the flag without its
hook.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from graphprof.capture.module_structure import TENSOR_HOOK_DICTS
from graphprof.capture.scalars import DataDependentError


class RegisteredHooks:
    """The hook dicts of the step's parameters, with their items when the capture call began."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self._before = [(p, name, f"a parameter of shape {tuple(p.shape)}", _items(p, name)) for p in params
                        for name in TENSOR_HOOK_DICTS]

    def refuse_changed(self) -> None:
        """Refuse a step that left a hook dict changed (a hook added that it did not remove)."""
        for holder, name, what, items in self._before:
            now = _items(holder, name)
            if now != items:
                added = next((fn for key, fn in now if (key, fn) not in items), None)
                hook = _named(added)
                raise DataDependentError(
                    f"the step registers or removes {hook} on {what} ({name}) and leaves it so: eager has one "
                    "more (or fewer) on every call, where a replayed graph runs the hooks the capture call ran")

    def restore(self) -> None:
        """Put each hook dict back as it was when the capture call began."""
        for holder, name, _, items in self._before:
            hooks = getattr(holder, name, None)
            if hooks is not None and _items(holder, name) != items:
                hooks.clear()
                hooks.update(items)


def _named(hook: Any) -> str:
    """The hook as the user knows it: a function of theirs by name, one torch made for them
    (``register_multi_grad_hook``'s) by the torch function that made it."""
    if hook is None:
        return "a hook"
    name = getattr(hook, "__qualname__", type(hook).__name__)
    module = getattr(hook, "__module__", None) or ""
    if module == "torch" or module.startswith("torch."):
        return f"a hook of {module}.{name.split('.<locals>')[0]}"
    return name


def _items(holder: Any, name: str) -> list[tuple[Any, Any]]:
    hooks = getattr(holder, name, None)
    return list(hooks.items()) if hooks else []
