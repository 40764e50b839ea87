"""Compiled forwards put in place through the module's class, never in the module's own ``__dict__``.

Why: segmented capture (capture/segmented.py) runs a module's compiled
forward in place of its ``forward`` while the step runs. Set as an instance
attribute (``model.__dict__["forward"]``), it went wherever the module's
``__dict__`` goes: ``copy.deepcopy(model)`` and ``copy.copy(model)`` in the
step (a "best model" snapshot, ``tq.convert(copy.deepcopy(model).eval())``,
MAML's ``fast = deepcopy(model)``) copied the closure, which runs the live
module: running the copy updated the original's BatchNorm statistics and
returned the original's outputs, and kept doing so after the step returned;
``torch.save(model, path)`` failed to pickle it; ``vars(model)`` showed it.

So the forward is installed on the class, as one dispatcher per class that
runs the compiled forward for the modules it was installed for, matched by
identity, and the class's own forward for every other instance: a copy is a
new module, never compiled, and runs eagerly as itself; a pickle holds the
class by name and nothing of graphprof's. ``nn.Module.compile`` keeps its
compiled call out of copies and pickles too (``Module.__getstate__`` drops
``_compiled_call_impl``). Each class a module is an instance of exactly gets
its own dispatcher, which knows only the modules of that class: a subclass's
forward calling ``super().forward(x)`` reaches the base class's own forward
(or the base's dispatcher, which does not know the subclass's module).

While dynamo traces (a compiled forward inlining a child of the same class,
``nn.Sequential`` in ``nn.Sequential``), the dispatcher calls the class's own
forward: dynamo inlines that, as it did the compiled forward it replaced.
Each dispatcher is made once and has a code object of its own, so dynamo's
guards on it hold from call to call and its cache is its own. The class gets
its attribute back when the step returns (removed where it had none).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

_MISSING = object()


class ClassForward:
    """The dispatcher installed as ``cls.forward`` while a segmented step runs."""

    def __init__(self, cls: type[nn.Module]) -> None:
        self.cls = cls
        self.compiled: dict[int, tuple[nn.Module, Callable[..., Any]]] = {}  # per id: the module, its forward
        self._own: list[Any] = [_MISSING]  # the class's forward as found at install, as one cell dynamo reads
        self._saved: Any = _MISSING  # what ``cls.__dict__`` held under "forward", or _MISSING
        compiled, own = self.compiled, self._own

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                entry = compiled.get(id(self))
                if entry is not None and entry[0] is self:
                    return entry[1](*args, **kwargs)
            return own[0](self, *args, **kwargs)

        forward.__code__ = forward.__code__.replace()  # a code object, so a dynamo cache, of its own
        self.function = forward

    def install(self) -> None:
        """Put the dispatcher on the class, over whatever forward the class resolves to now."""
        own = self.cls.forward
        self._saved = self.cls.__dict__.get("forward", _MISSING)
        self._own[0] = own
        functools.update_wrapper(self.function, own)  # inspect.signature(model.forward) sees the user's
        type.__setattr__(self.cls, "forward", self.function)

    def uninstall(self) -> None:
        """Give the class its own attribute back, where the dispatcher is still in place."""
        if self.cls.__dict__.get("forward", _MISSING) is not self.function:
            return  # the step set the class's forward itself: it keeps it, as in eager
        if self._saved is _MISSING:
            type.__delattr__(self.cls, "forward")
        else:
            type.__setattr__(self.cls, "forward", self._saved)
        self._saved = _MISSING


class InstalledForwards:
    """Per class, the dispatcher that runs ``forwards`` for their modules."""

    def __init__(self, forwards: list[tuple[nn.Module, Callable[..., Any]]]) -> None:
        self._classes: dict[type[nn.Module], ClassForward] = {}
        for module, forward in forwards:
            dispatch = self._classes.get(type(module))
            if dispatch is None:
                dispatch = self._classes[type(module)] = ClassForward(type(module))
            dispatch.compiled[id(module)] = (module, forward)

    def install(self) -> None:
        for dispatch in self._classes.values():
            dispatch.install()

    def uninstall(self) -> None:
        for dispatch in reversed(list(self._classes.values())):
            dispatch.uninstall()
