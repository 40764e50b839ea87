"""Hooks the step registers, or removes, and leaves so: the capture call's graph is not kept.

A step that registers a hook on every call and never removes it
(``model.fc.register_forward_hook(log)``, ``opt.register_step_post_hook(count)``,
``register_module_forward_hook(fn)``, ``p.register_hook(fn)``,
``register_multi_grad_hook(params, fn)``) leaves one more each time: eager
runs n of them in call n. A replayed graph runs the ones the capture call
ran, as many as it found, forever after, and the hook dicts stay at the
capture call's count.

So the hook dicts the step can reach are compared before and after the
capture call: its parameters' gradient hooks, its modules' forward, backward
and state-dict hooks, its optimizers' step and state-dict hooks, and torch's
global module and optimizer hooks. When the call left one changed
(``changed``), its graph is not kept: the call itself stands, as a capture
call always does (it ran the step for real), and the next call captures
again (``FallbackPolicy.after_hooks_left``). Why not refuse for good at once: a
library installs a hook lazily, once, the first time a path needs it, and
keeps a flag that it did (transformers' hook that collects hidden states
when ``output_hidden_states`` is first switched on); one capture call cannot
tell that from a hook added on every call. The next capture can: when it
leaves a hook dict changed again, the step registers hooks on every call.
Why not refuse this call and run it again eagerly: the capture would have to
take back the flag with the hook, wherever the library keeps it; a call
that stands needs nothing taken back.

A capture refused for another reason does take back the hooks the call left
(``restore``), with the rest of what it changed, so that the step's next run
registers its own once. A flag set beside a hook (a library's
``_hooks_installed``, torch's ``_is_full_backward_hook``) goes back with the
modules' attributes (capture/module_contents.py), and torch's global
full-backward flag here: a flag left without its hook, the step's next run
would not install it again.

A hook on a tensor the step makes (a multi-grad hook on this call's
activations) dies with it and changes nothing here; one the step registers
and removes again before it returns is the same on every call and is
replayed as the capture call ran it; graphprof's own (the recorder's global
hooks) are gone before the comparison.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals

from graphprof.capture.module_structure import (GLOBAL_OPTIMIZER_HOOK_DICTS, HOOK_DICTS, MODULE_GLOBAL_HOOK_DICTS,
                                                OPTIMIZER_HOOK_DICTS, TENSOR_HOOK_DICTS)

#: A module's hooks that run outside the step (``state_dict()``, ``load_state_dict()``): one left by every
#: call is eager's to run later, n of them after n calls.
_MODULE_STATE_HOOK_DICTS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                            "_load_state_dict_post_hooks")
_OPTIMIZER_STATE_HOOK_DICTS = ("_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                               "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
_GLOBAL_REGISTRATION_HOOK_DICTS = ("_global_buffer_registration_hooks", "_global_module_registration_hooks",
                                   "_global_parameter_registration_hooks")
#: The flag ``register_module_full_backward_hook`` sets beside its hook.
_GLOBAL_FULL_BACKWARD = "_global_is_full_backward_hook"


class RegisteredHooks:
    """The hook dicts the step can reach, with their items when the capture call began."""

    def __init__(self, params: Iterable[torch.Tensor], modules: Iterable[nn.Module] = (),
                 optimizers: Iterable[torch.optim.Optimizer] = ()) -> None:
        holders: list[tuple[Any, tuple[str, ...], str]] = [
            (p, TENSOR_HOOK_DICTS, f"a parameter of shape {tuple(p.shape)}") for p in params]
        holders += [(m, HOOK_DICTS + _MODULE_STATE_HOOK_DICTS, f"a {type(m).__name__}") for m in modules]
        holders += [(o, OPTIMIZER_HOOK_DICTS + _OPTIMIZER_STATE_HOOK_DICTS, f"the optimizer {type(o).__name__}")
                    for o in optimizers]
        holders += [(module_globals, MODULE_GLOBAL_HOOK_DICTS + _GLOBAL_REGISTRATION_HOOK_DICTS,
                     "torch's global module hooks"),
                    (optimizer_globals, GLOBAL_OPTIMIZER_HOOK_DICTS, "torch's global optimizer hooks")]
        self._before = [(holder, name, what, _items(holder, name)) for holder, names, what in holders
                        for name in names]
        #: Torch's global full-backward flag: what ``register_module_full_backward_hook`` sets beside its hook.
        self._global_flag = vars(module_globals).get(_GLOBAL_FULL_BACKWARD)

    def changed(self) -> str | None:
        """What the step left changed (a hook added that it did not remove, or one removed), or None."""
        for holder, name, what, items in self._before:
            now = _items(holder, name)
            if now != items:
                added = next((fn for key, fn in now if (key, fn) not in items), None)
                return f"registers or removes {_named(added)} on {what} ({name}) and leaves it so"
        return None

    def restore(self) -> None:
        """Put each hook dict back as it was when the capture call began, and torch's global
        full-backward flag: a flag that says the hook is installed must not outlive the hook."""
        for holder, name, _, items in self._before:
            hooks = getattr(holder, name, None)
            now = _items(holder, name)
            if hooks is not None and now != items:
                # graphprof's own global hooks (the capture's DDP check) are as graphprof has them now: an
                # undo run after the capture's block ended must not register them again, for good.
                own_now = [(key, fn) for key, fn in now if _graphprofs(fn)]
                hooks.clear()
                hooks.update([(key, fn) for key, fn in items if not _graphprofs(fn)] + own_now)
        if vars(module_globals).get(_GLOBAL_FULL_BACKWARD) is not self._global_flag:
            setattr(module_globals, _GLOBAL_FULL_BACKWARD, self._global_flag)


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


def _graphprofs(hook: Any) -> bool:
    """Whether ``hook`` is one of graphprof's own (registered for the length of a capture)."""
    module = getattr(hook, "__module__", None) or ""
    return module == "graphprof" or module.startswith("graphprof.")


def _items(holder: Any, name: str) -> list[tuple[Any, Any]]:
    hooks = getattr(holder, name, None)
    return list(hooks.items()) if hooks else []
