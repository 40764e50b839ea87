"""Flags the step itself switches: parameters' ``requires_grad`` and modules' ``training``.

A GAN step freezes its discriminator while the generator trains
(``for p in D.parameters(): p.requires_grad_(False)``) and unfreezes it at
the start of the next step; a training step calls ``model.train()`` first
thing while the loop evaluates between calls. The graph depends on the
flags the step *found* (what the replay check compares: a read after the
step's own write sees the value it wrote), and the flags it *leaves* are
Python state the user observes afterwards, which a replay, running no
Python, would not set. Comparing the flags the capture call left made every
call after an evaluation capture again (five times, then segments), and a
replay left the flags as the call found them, so the next call's path was
decided on the wrong ones.

``SwitchedFlags`` notes each object's flag before the step; afterwards one
effect at the graph's end gives every object the step switched the flag the
capture call left it with. A refused capture puts the flags back, so that
the step's run as segments finds eager's flags.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch import nn

from graphprof.capture.host_nodes import effect_node


class SwitchedFlags:
    """One boolean flag of each of some objects, as the step found it."""

    def __init__(self, objects: Iterable[Any], what: str, read: Callable[[Any], bool],
                 write: Callable[[Any, bool], Any]) -> None:
        self._what, self._read, self._write = what, read, write  # what: "requires_grad of {n} parameters"
        self._before = {id(o): (o, read(o)) for o in objects}

    def at_entry(self, obj: Any) -> bool:
        """The flag ``obj`` had when the step began (an object first met in the step: as it is now)."""
        entry = self._before.get(id(obj))
        return entry[1] if entry is not None else self._read(obj)

    @property
    def all_at_entry(self) -> tuple[bool, ...]:
        """Every object's flag when the step began, in the order the objects were given."""
        return tuple(flag for _, flag in self._before.values())

    def effects(self, graph: torch.fx.Graph, record: Any) -> None:
        """One effect that sets the flags the step switched, as the capture call left them."""
        read, write = self._read, self._write
        switched = [(o, read(o)) for o, was in self._before.values() if read(o) is not was]
        if not switched:
            return

        def apply(values: tuple) -> None:
            for obj, flag in switched:
                write(obj, flag)

        effect_node(graph, f"set {self._what.format(n=len(switched))}", apply, [], record)

    def restore(self) -> None:
        """Put every flag back as the step found it (the capture is refused: the step runs again)."""
        for obj, flag in self._before.values():
            if self._read(obj) is not flag:
                self._write(obj, flag)


def parameter_flags(params: Iterable[torch.Tensor]) -> SwitchedFlags:
    """The parameters' ``requires_grad``."""
    return SwitchedFlags(params, "requires_grad of {n} parameters", operator.attrgetter("requires_grad"),
                         lambda p, flag: p.requires_grad_(flag))


def module_modes(modules: Iterable[nn.Module]) -> SwitchedFlags:
    """The modules' ``training`` flags (set directly: ``train()`` would set the children's too)."""
    return SwitchedFlags(modules, "training of {n} modules", operator.attrgetter("training"),
                         lambda m, flag: setattr(m, "training", flag))
