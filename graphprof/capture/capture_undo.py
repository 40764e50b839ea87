"""Putting back what a capture call changed, when its capture is refused or fails.

Why a module of its own: the capture call is a real training step. When
graphprof refuses the graph (or fails after the step ran), the step runs again
another way, so everything the capture call changed must first be as it was,
or the fallback runs the step twice: the parameters' flags, the tensors it wrote,
the watched Python values, the optimizers, schedulers, scalers and hooks
(``undo_capture``). The gradients of leaf tensors that are not parameters are
checked here too (``LeafGrads``): a graph reading one is refused, and its
accumulation undone.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

from graphprof.capture.errors import StateNotRestored
from graphprof.capture.inputs import PythonState
from graphprof.capture.name_read_checks import put_back_unseen_globals
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.switched_flags import SwitchedFlags


class LeafGrads:
    """The tensors the step reaches that require grad and are not its parameters (``d["w"] =
    torch.ones(4, requires_grad=True)``, put there by the user), with their ``.grad`` before the call.

    Why: eager's backward accumulates into their ``.grad``; the graph writes the gradients of the
    parameters it knows, so a replay reading one left its ``.grad`` as the last eager call had it,
    silently. Such a graph is refused (``refuse``), and the capture call's accumulation is put back
    first, so that the fallback runs the call and accumulates once.
    """

    def __init__(self, python: PythonState, params: Any) -> None:
        with _disable_current_modes():  # copies of the caller's values, not ops of the traced step
            self.found = [(e.location.describe, t, None if t.grad is None else t.grad.detach().clone(), t.grad)
                          for e in python.places.watched if isinstance(t := e.before, torch.Tensor) and t.requires_grad
                          and t.is_leaf and id(t) not in params]

    def refuse(self, read: set[int]) -> None:
        for where, t, _, _ in self.found:
            if id(t) in read:
                with _disable_current_modes():
                    self.restore()
                raise DataDependentError(f"the step reads {where}, a tensor that requires grad and is not a "
                                         "parameter of its model or optimizer: a replay would not accumulate its "
                                         ".grad as eager's backward does")

    def restore(self) -> None:
        for _, t, values, grad in self.found:
            if grad is not None and values is not None:
                grad.copy_(values)  # the same tensor the caller may hold, with its values from before
            t.grad = grad



def undo_capture(holder: dict[str, Any], flags: SwitchedFlags, modes: SwitchedFlags, hyperparameters: bool) -> None:
    """Put back what the capture call changed, as far as it got (``holder``: what it had set up): the
    flags, the recorded tensor writes, the contents below the watched values, the optimizers,
    schedulers and scalers, then the watched values themselves (they hold the capture's inputs: a
    scaler's or a custom optimizer's number fields, which the torch objects' copy, taken after the
    inputs were put in, holds too)."""
    steps: list[tuple[str, Callable[[], Any]]] = [("parameters' requires_grad", flags.restore),
                                                  ("modules' training modes", modes.restore)]
    if "recorder" in holder:
        recorder = holder["recorder"]
        if hyperparameters:
            steps += [("optimizers' hyperparameters", recorder.hyperparameters.restore),
                      ("schedulers' fields", recorder.scheduler_fields.restore)]
        steps.append(("tensors the step wrote", recorder.write_log.restore))
    if "names" in holder:
        steps.append(("globals", functools.partial(put_back_unseen_globals, holder["names"], holder.get("python"))))
    steps += [(what, holder[key].restore) for key, what in _UNDONE if key in holder]
    # Every one is tried: one that stopped the rest left the user's objects holding graphprof's numbers.
    failures: list[tuple[str, BaseException]] = []
    for what, restore in steps:
        try:
            restore()
        except StateNotRestored as exc:
            failures += exc.failures
        except Exception as exc:
            failures.append((what, exc))
    if failures:
        raise StateNotRestored(failures)


#: What ``undo_capture`` puts back after the tensors, in this order: (key in its holder, what it holds). The
#: modules' dicts first: a module's attribute is put back where the module keeps it (a pruned ``weight``,
#: a plain attribute again once ``prune.remove``'s registered parameter is gone).
_UNDONE = (("modules", "modules' attributes"), ("deep", "the contents of the step's lists, dicts and objects"),
           ("torch_objects", "optimizers, schedulers and scalers"), ("python", "the step's Python values"),
           ("numpy", "numpy's random state"), ("hooks", "hooks"))
