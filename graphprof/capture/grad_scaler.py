"""A gradient scaler's overflow branch: captured on the path that steps, checked where it branches.

``torch.amp.GradScaler.step`` unscales the gradients, counts the non-finite
ones into ``found_inf`` and runs ``optimizer.step()`` only when that count is
zero (``_maybe_opt_step``: ``if not sum(v.item() for v in ...)``). The count
depends on the gradients, so no check before the replay can know it (the
value guards of capture/value_guards.py recompute only values of the
inputs), and every step with a scaler used to run as segments.

Yet the branch has a rare side: a step overflows once in a long while (more
often early in float16 training, while the scale comes down). So the capture
follows the side eager takes on a call that does not overflow (the optimizer
steps), and puts a host node at the branch that raises
``GradientsOverflowed`` when the replayed count is not zero. Everything
before it (forward, backward, the unscale into the step's own new gradients)
writes nothing the user holds; the optimizer's update and the scaler's
``_amp_update_scale_`` come after it. A replay stopped there has changed
nothing, and the call runs eagerly from the state it started with
(runtime/failed_replays.py decides that and puts the generators back):
eager's skipped step, its halved scale, its unscaled non-finite gradients.
Later calls replay again. The capture refuses a graph where something the
user holds would be written before a check (gradients accumulated into, a
second optimizer's check after the first one's update), so that never a
replay stops half done.

A capture call that overflows took the side that skips: that path is not
captured (``DataDependentError.this_call_only``); the call runs eagerly and
the next call captures again. A subclass of GradScaler that replaces
``_maybe_opt_step`` is not recognised here: its branch refuses as before.

An optimizer that unscales and skips inside its own kernel (``fused=True``:
``_step_supports_amp_scaling``) has no branch: the scaler hands it its scale
and count as ``optimizer.grad_scale`` and ``optimizer.found_inf``, and a
replay of its kernel skips as eager's does. No check is needed there.
"""

from __future__ import annotations

from types import CodeType
from typing import Any

import torch
import torch.fx

#: The code of GradScaler's branch on the count of non-finite gradients.
OVERFLOW_BRANCH: CodeType = torch.amp.GradScaler._maybe_opt_step.__code__
#: Marks the host node that checks a replay's count of non-finite gradients.
OVERFLOW_CHECK = "graphprof.overflow_check"
_CAPTURE = "graphprof.capture"
_SCALAR = "graphprof_scalar"


class GradientsOverflowed(RuntimeError):
    """A replay's gradients overflowed where the captured call's did not: the step runs eagerly."""


def _check(found_inf: Any) -> None:
    if found_inf:
        raise GradientsOverflowed("the gradient scaler found non-finite gradients: eager skips the optimizer's step")


_check.__name__ = _check.__qualname__ = "check gradient overflow"
_check.__module__ = "host"


def add_overflow_check(graph: torch.fx.Graph, found_inf: torch.fx.Node) -> torch.fx.Node:
    """A host node (at the graph's insert point) that raises ``GradientsOverflowed`` when ``found_inf``,
    the replayed sum of the scaler's counts, is not zero."""
    node = graph.call_function(_check, (found_inf,))
    node.meta[OVERFLOW_CHECK] = True
    node.meta[_SCALAR] = True
    if _CAPTURE in found_inf.meta:
        node.meta[_CAPTURE] = found_inf.meta[_CAPTURE]
    return node


def overflow_checks(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The graph's overflow checks, in order."""
    return [node for node in graph.nodes if node.meta.get(OVERFLOW_CHECK)]
