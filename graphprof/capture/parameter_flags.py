"""Parameters whose ``requires_grad`` the step itself switches: the switch is replayed.

A GAN step freezes its discriminator while the generator trains
(``for p in D.parameters(): p.requires_grad_(False)``) and unfreezes it at
the start of the next step; with ``n_critic`` the generator trains every
other call, so the flags a call leaves depend on its path. The graph
computes the gradients the flags asked for during the capture call, but the
flags themselves are Python state: a replay left them as the call found
them, and the next call's path was decided on the wrong ones (after one
wrong replay the flags differed from eager's and the capture paths churned).

``ParameterFlags`` notes each parameter's flag before the step; afterwards
one effect at the graph's end gives every parameter the step switched the
flag the capture call left it with. A refused capture puts the flags back.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx

from graphprof.capture.host_nodes import effect_node


class ParameterFlags:
    """``requires_grad`` of the step's parameters when it begins."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self._before = {id(p): (p, p.requires_grad) for p in params}

    def at_entry(self, param: torch.Tensor) -> bool:
        """The flag ``param`` had when the step began (a parameter first met in the step: as it is now)."""
        entry = self._before.get(id(param))
        return entry[1] if entry is not None else param.requires_grad

    def effects(self, graph: torch.fx.Graph, record: Any) -> None:
        """One effect that sets the flags the step switched, as the capture call left them."""
        switched = [(p, p.requires_grad) for p, was in self._before.values() if p.requires_grad is not was]
        if not switched:
            return

        def apply(values: tuple) -> None:
            for param, flag in switched:
                param.requires_grad_(flag)

        effect_node(graph, f"set requires_grad of {len(switched)} parameters", apply, [], record)

    def restore(self) -> None:
        """Put every flag back as the step found it (the capture is refused: the step runs again)."""
        for param, flag in self._before.values():
            if param.requires_grad is not flag:
                param.requires_grad_(flag)
