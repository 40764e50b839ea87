"""Parameters whose gradient hooks a segmented step would run in another order than eager.

Why: eager's autograd engine runs a parameter's hooks (``p.register_hook``,
``p.register_post_accumulate_grad_hook``) when its own ``AccumulateGrad``
node becomes ready, in the order eager's backward graph gives: for
``nn.Sequential(Linear, ReLU, Linear)``, ``2.bias, 2.weight, 0.bias,
0.weight``. The backward of a forward torch.compile compiled (capture/
segmented.py) is one autograd node that produces all its parameters'
gradients at once, and the engine then runs their ``AccumulateGrad`` nodes
in the order its ready queue keeps for nodes of one priority: ``0.weight,
2.weight, 0.bias, 2.bias``. Hooks that log (``norms.append((name,
g.norm().item()))``) built lists in another order, silently. Eager's order
cannot be had from the compiled node: it is the order of the backward graph
eager would have built, which the compiled backward replaces.

So a segmented step whose compiled modules have hooks on two or more
parameters runs eagerly while they are registered, unprofiled (one hook has
no order to change); the step's one fallback warning says so
(``hooks_note``). Checked on every call: hooks are registered and removed
between calls (``if step % 100 == 0``).
"""

from __future__ import annotations

from itertools import islice
from typing import Iterable

import torch
from torch import nn


class GradientHooks:
    """The parameters of the modules a segmented step compiles, and which of them carry gradient hooks."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        named: dict[int, tuple[str, torch.Tensor]] = {}
        for module in modules:
            for name, parameter in module.named_parameters():
                named.setdefault(id(parameter), (name, parameter))
        self._parameters = list(named.values())

    def hooked(self) -> list[str]:
        """The names of the parameters that need a gradient and carry a hook, when there are two or more."""
        hooked = (name for name, parameter in self._parameters if parameter.requires_grad
                  and (parameter._backward_hooks or parameter._post_accumulate_grad_hooks))
        first_two = list(islice(hooked, 2))  # checked on every segmented call: most steps stop at none
        return [*first_two, *hooked] if len(first_two) == 2 else []


def hooks_note(names: list[str]) -> str:
    """What the fallback warning adds for a step whose parameters ``names`` carry gradient hooks (none: "")."""
    if not names:
        return ""
    listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"; while its parameters' gradient hooks are registered ({listed}), it runs eagerly, unprofiled: "
            "torch.compile's backward would run them in another order than eager")
