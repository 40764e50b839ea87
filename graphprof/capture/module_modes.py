"""Modules' ``training`` flags: read as the step finds them, and switched as the step switched them.

A training step very often sets its own mode (``model.train()`` first
thing, an evaluation step ``model.eval()``), and the loop around it runs the
other mode between calls. The flags a graph was decided on are the ones the
step *found*: a read after the step's own ``model.train()`` sees the value
it wrote, which the replay check cannot and need not test. And the flags the
step *leaves* are part of what the user observes afterwards, which a replay,
running no Python, would not set.

Two mistakes followed from comparing the flags after the capture call
instead: a step calling ``model.train()`` with evaluation between calls
found eval flags on every call, saw "switched to eval mode", and captured
again each time, five times, then fell back to segments; and a replay left
the flags as the call found them.

``ModuleModes`` notes every module's flag when the step begins (what the
replay check compares) and, after the step, adds one effect at the graph's
end that gives each module the step switched the flag the capture call left
it with. A refused capture puts the flags back.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch.fx
from torch import nn

from graphprof.capture.host_nodes import effect_node


class ModuleModes:
    """The ``training`` flag of each of the step's modules when it begins."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._before = tuple((m, m.training) for m in modules)

    @property
    def at_entry(self) -> tuple[Any, ...]:
        """Each module's flag when the step began, in the order the modules were given."""
        return tuple(mode for _, mode in self._before)

    def effects(self, graph: torch.fx.Graph, record: Any) -> None:
        """One effect that sets the flags the step switched, as the capture call left them."""
        switched = [(m, m.training) for m, was in self._before if m.training is not was]
        if not switched:
            return

        def apply(values: tuple) -> None:
            for module, mode in switched:
                module.training = mode

        effect_node(graph, f"set training of {len(switched)} modules", apply, [], record)

    def restore(self) -> None:
        """Put every flag back as the step found it (the capture is refused: the step runs again)."""
        for module, mode in self._before:
            if module.training is not mode:
                module.training = mode

